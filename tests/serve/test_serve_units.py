"""The server's plain-Python pieces: the output parser at every split point, the queue's order and bounds,
and the engine's cancel reaching into a prefill."""
import threading
import time

import pytest

from engine.params import GenerationParams, TokenEvent
from engine.serve.parsing import OutputParser
from engine.serve.queue import GenerationQueue, QueueFull

ANSWER = '<think>plan</think>\n\nSure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def parse(text: str, cut: int, **features) -> list:
    parser = OutputParser(**features)
    pieces = parser.push(text[:cut]) + parser.push(text[cut:]) + parser.flush()
    merged = []                                   # adjacent text of one kind, as a client accumulates it
    streamed = {}                                 # a call's arguments as its pieces streamed them
    for p in pieces:
        if p.call is not None:
            streamed[p.call.id] = streamed.get(p.call.id, "") + p.text
            if p.kind == "tool_end":
                assert streamed[p.call.id] == p.call.arguments
                merged.append(("tool_call", (p.call.name, p.call.arguments)))
        elif merged and p.kind == merged[-1][0]:
            merged[-1] = (p.kind, merged[-1][1] + p.text)
        else:
            merged.append((p.kind, p.text))
    return merged


@pytest.mark.parametrize("cut", range(len(ANSWER) + 1))
def test_tags_split_anywhere_parse_the_same(cut):
    assert parse(ANSWER, cut, think=True, tools=True) == [
        ("reasoning", "plan"), ("content", "Sure.\n"), ("tool_call", ("f", '{"x": 1}'))]


def test_without_tools_or_thinking_the_text_is_content():
    assert parse(ANSWER, 7) == [("content", ANSWER)]
    assert parse("a < b <tool", 9, tools=True) == [("content", "a < b <tool")]


def test_a_template_that_opens_the_thought_and_a_broken_call():
    assert parse("hm</think>ok", 3, starts_in_think=True, think=True) == [("reasoning", "hm"), ("content", "ok")]
    assert parse("<tool_call>{oops}</tool_call>", 4, tools=True) == [("content", "<tool_call>{oops}</tool_call>")]


class SlowEngine:
    """Yields `n` tokens, `delay_s` apart; records the order of prompts it ran."""

    def __init__(self, n=3, delay_s=0.02):
        self.n, self.delay_s, self.ran = n, delay_s, []
        self._cancel = threading.Event()

    def generate(self, prompt, params):
        self.ran.append(prompt)
        self._cancel.clear()
        for i in range(self.n):
            time.sleep(self.delay_s)
            if self._cancel.is_set():
                yield TokenEvent(None, "", True, "cancelled")
                return
            yield TokenEvent(i, str(i), i == self.n - 1, "length" if i == self.n - 1 else None)

    def cancel(self):
        self._cancel.set()


def test_queue_runs_in_order_bounds_waiting_and_cancels():
    engine = SlowEngine(n=50)
    queue = GenerationQueue(engine, max_waiting=2)
    try:
        first = queue.submit("a", GenerationParams())
        while first.state != "running":
            time.sleep(0.001)
        second, third = queue.submit("b", GenerationParams()), queue.submit("c", GenerationParams())
        with pytest.raises(QueueFull) as full:
            queue.submit("d", GenerationParams())
        assert full.value.retry_after_s >= 1
        assert queue.counters() == {"queued": 2, "active": 1, "served": 0}
        second.cancel()                               # a waiting job leaves the queue, never reaching the engine
        assert [e.finish_reason for e in second] == ["cancelled"]
        first.cancel()                                # a running job stops within one token
        assert list(first)[-1].finish_reason == "cancelled"
        assert [e.text for e in third][:3] == ["0", "1", "2"]
        assert engine.ran == ["a", "c"]
        assert queue.counters() == {"queued": 0, "active": 0, "served": 2}
    finally:
        queue.close()


def test_cancel_stops_the_engine_during_prefill(serve_model):
    import engine
    eng = engine.load(serve_model)
    try:
        prompt = list(range(3, 383)) + [5] * 20      # 400 tokens (vocab 400): a prefill through 4 layers
        stop = threading.Event()

        def keep_cancelling():                        # generate() clears the flag when it starts
            while not stop.is_set():
                eng.cancel()
                time.sleep(0.0005)
        thread = threading.Thread(target=keep_cancelling)
        thread.start()
        try:
            events = list(eng.generate(prompt, GenerationParams(max_new_tokens=5, temperature=0)))
        finally:
            stop.set()
            thread.join()
        assert [(e.token_id, e.finish_reason) for e in events] == [(None, "cancelled")]
        after = list(eng.generate(prompt[:8], GenerationParams(max_new_tokens=3, temperature=0)))
        assert len(after) == 3 and after[-1].finish_reason == "length"     # the engine is usable afterwards
    finally:
        eng.close()
