"""The streaming is real, prefill reads each expert at most once per layer, and the API behaves."""
import os
import threading
from collections import Counter

import pytest

import engine
from engine import GenerationParams
from tests.streaming.sized import streaming_engine

LONG_PROMPT = [(i * 37) % 300 + 3 for i in range(160)]


def test_prefill_reads_each_expert_at_most_once_per_layer(sluice_models):
    eng = streaming_engine(sluice_models("olmoe", "fp8"))
    reads = Counter()
    real_read = eng.runner.store.read_into
    eng.runner.store.read_into = lambda layer, expert, buf: (reads.update([(layer, expert)]), real_read(layer, expert, buf))[1]
    list(eng.generate(LONG_PROMPT, GenerationParams(max_new_tokens=1, temperature=0)))   # prefill only
    assert len(reads) == 3 * 8                   # a long prompt routes to every expert of every layer
    assert max(reads.values()) == 1
    assert eng.telemetry()["disk"]["max_reads_per_expert_in_prefill"] == 1
    assert eng.runner.experts.batch_size == 2         # slots for top_k experts per bank: experts came in batches


def test_decode_streams_from_disk_and_hits_the_caches(sluice_models):
    eng = streaming_engine(sluice_models("qwen3_moe", "bf16"))
    list(eng.generate(LONG_PROMPT[:10], GenerationParams(max_new_tokens=40, temperature=0)))
    first = eng.telemetry()
    list(eng.generate(LONG_PROMPT[10:30], GenerationParams(max_new_tokens=40, temperature=0)))
    second = eng.telemetry()
    assert second["disk"]["bytes_read"] > first["disk"]["bytes_read"] > 0
    assert second["ram_cache"]["hits"] > first["ram_cache"]["hits"] > 0
    assert first["ram_cache"]["evictions"] > 0 and first["ram_cache"]["used_bytes"] <= first["ram_cache"]["capacity_bytes"]
    states = {s["state"] for s in second["vram"]["slots"]}
    assert states <= {"empty", "loading", "ready", "computing"} and "ready" in states
    assert len(second["vram"]["slots"]) == 2 * eng.plan.slots_per_bank
    assert second["decode_thread_core"] in os.sched_getaffinity(0)


def test_cancel_from_another_thread_stops_within_one_token(sluice_models):
    eng = engine.load(sluice_models("mixtral", "bf16"))
    events, cancelled_at = [], []

    def consume():
        for event in eng.generate(LONG_PROMPT[:8], GenerationParams(max_new_tokens=400, temperature=0)):
            events.append(event)
            if len(events) == 5:
                eng.cancel()
                cancelled_at.append(len(events))
    worker = threading.Thread(target=consume)
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    assert events[-1].finished and events[-1].finish_reason == "cancelled"
    assert len(events) <= cancelled_at[0] + 1
    # the engine is usable again afterwards
    assert list(eng.generate([1, 2, 3], GenerationParams(max_new_tokens=3, temperature=0)))[-1].finish_reason == "length"


def test_sampling_is_seeded_and_degenerate_settings_equal_greedy(sluice_models):
    eng = engine.load(sluice_models("qwen3_moe", "bf16"))
    ids = lambda **p: [e.token_id for e in eng.generate([4, 5, 6], GenerationParams(max_new_tokens=12, **p))]  # noqa: E731
    greedy = ids(temperature=0)
    assert ids(temperature=0.9, seed=1) == ids(temperature=0.9, seed=1)
    assert ids(temperature=1.5, seed=1) != ids(temperature=1.5, seed=2) or ids(temperature=1.5, seed=3) != greedy
    assert ids(temperature=1.0, top_k=1, seed=5) == greedy
    assert ids(temperature=1.0, top_p=1e-6, seed=5) == greedy


def test_chat_messages_use_the_template_and_stop_strings_cut_output(sluice_models):
    eng = engine.load(sluice_models("qwen3_moe", "bf16"))
    ids, is_chat = eng.encode([{"role": "user", "content": "hi"}])
    assert is_chat and eng.tokenizer.decode(ids).startswith("<|im_start|>user\nhi<|im_end|>")
    full = "".join(e.text for e in eng.generate([{"role": "user", "content": "hi"}],
                                                GenerationParams(max_new_tokens=30, temperature=0)))
    stop = full[5:8]
    if not stop.strip():
        pytest.skip("generated text too short to pick a stop string")
    events = list(eng.generate([{"role": "user", "content": "hi"}],
                               GenerationParams(max_new_tokens=30, temperature=0, stop=[stop])))
    assert events[-1].finish_reason == "stop"
    assert "".join(e.text for e in events) == full[:full.index(stop)]


EXIT_SCRIPT = """
import atexit, sys, threading

def check():          # registered before anything of the engine is imported: runs after its exit handler
    print("fillers alive at exit:", [t.name for t in threading.enumerate() if t.name == "sluice-ram-fill"], flush=True)
atexit.register(check)
import engine
from engine import GenerationParams
eng = engine.load(sys.argv[1])
assert eng._filler is not None and eng._filler.is_alive()
list(eng.generate([4, 5, 6], GenerationParams(max_new_tokens=2, temperature=0)))
"""


def test_an_engine_left_open_stops_its_ram_filler_before_python_exits(sluice_models):
    """A script that never closes its engine exits cleanly: a filler thread still inside a torch call while the
    interpreter finalizes aborts the process ("terminate called without an active exception", exit 134)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(sluice_models("qwen3_moe", "bf16"))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fillers alive at exit: []" in done.stdout
