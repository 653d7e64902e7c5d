"""What the demo model streams through Engine.generate (the path of the app, the chat store and the server):
printable text at temperature 1, and pieces that add up to the decode of the tokens, an unfinished last
character included."""
import pytest

import engine
import engine.engine
from engine import GenerationParams
from engine.tools.demo import build_demo_model, demo_load_options

CHAT = [{"role": "user", "content": "Tell me about experts"}]


@pytest.fixture(scope="module")
def demo_engine(tmp_path_factory):
    model = build_demo_model(tmp_path_factory.mktemp("demo") / "demo")
    eng = engine.load(model, **demo_load_options(model))
    yield eng
    eng.close()


def _decode(eng, ids: list[int]) -> str:
    return eng.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def test_temperature_one_answers_are_printable_and_add_up_to_their_decode(demo_engine):
    for seed in range(3):
        events = list(demo_engine.generate(CHAT, GenerationParams(max_new_tokens=40, temperature=1.0, seed=seed)))
        text = "".join(e.text for e in events)
        assert "\ufffd" not in text and text.replace("\n", "").isprintable()
        assert text == _decode(demo_engine, [e.token_id for e in events if e.token_id is not None])


def test_a_character_split_across_tokens_arrives_whole_and_an_unfinished_one_at_the_end(demo_engine, monkeypatch):
    tok = demo_engine.tokenizer
    script = iter(tok.convert_tokens_to_ids(list("hiðŁĻĤðŁ")))    # byte-level 'hi', 🙂's 4 bytes, 2 bytes of another
    monkeypatch.setattr(engine.engine, "TokenSampler", lambda *args: _Scripted(script))
    events = list(demo_engine.generate(CHAT, GenerationParams(max_new_tokens=8, temperature=0)))
    assert [e.text for e in events] == ["h", "i", "", "", "", "🙂", "", "\ufffd"]
    assert events[-1].finish_reason == "length"


class _Scripted:
    logprobs = None

    def __init__(self, tokens):
        self.tokens = tokens

    def __call__(self, logits) -> int:
        return next(self.tokens)
