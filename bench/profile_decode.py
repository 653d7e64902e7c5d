"""Where the decode thread's time goes, sampled (py-spy) rather than traced, so the profile does not
slow the Python it measures. Two modes:

    py-spy record -r 1000 -f raw -o decode.raw -- python -m bench.profile_decode run MODEL_DIR [VRAM] [TOKENS]
    python -m bench.profile_decode summary decode.raw

PROFILE_PHASE=prefill (both modes) profiles warm prefills instead: after the warm-up, 4 new prompts of
TOKENS tokens, one token generated each; the samples kept are those under Runner.prefill. py-spy leaves
out a thread's idle samples (waiting for the GPU), so samples / 1000 beside the printed wall time says how
much of a prefill the host thread was busy.

`run` decodes through Engine.generate (temperature 1, like the bench): a warm-up generation first, then
the profiled one. `summary` keeps the profiled generation's samples under Runner.decode (its decode
steps: not the load, the warm-up or the prefill) and prints, per function, the share of the decode thread's samples spent in it (inclusive) and in its
own code (self), plus ms a token.
"""
from __future__ import annotations

import os
import re
import sys
from collections import Counter

PHASE = os.environ.get("PROFILE_PHASE", "decode")
PHASE_FRAME = re.compile(rf"^(Runner\.)?{PHASE} \(.*runner\.py")   # py-spy names methods with or without the class
PROFILED_FRAME = re.compile(r"^_profiled \(.*profile_decode\.py")


def run(model_dir: str, vram_budget: str = "4GB", tokens: int = 256) -> None:
    import random

    import engine
    device = os.environ.get("SLUICE_PROFILE_DEVICE", "cuda")     # cpu: to try the script without a GPU
    eng = engine.load(model_dir, device=device, vram_budget=vram_budget, ram_cache="16GB", max_context=1024,
                      dense_quant=os.environ.get("SLUICE_PROFILE_DENSE", "int8") or None)     # as the bench
    rng = random.Random(0)
    new_prompt = lambda n: [rng.randrange(eng.spec.vocab_size) for _ in range(n)]       # noqa: E731
    _generate(eng, new_prompt(512), 128)           # fills the RAM cache (a prompt reads nearly every expert) and banks
    _generate(eng, new_prompt(64), 64)
    prompt = new_prompt(64)                        # the profiled one routes anew (a repeated prompt hits more)
    if PHASE == "prefill":
        prompts = [[rng.randrange(eng.spec.vocab_size) for _ in range(tokens)] for _ in range(5)]
        _generate(eng, prompts[0], 1)
        _profiled(eng, prompts[1:], 1)
    else:
        _profiled(eng, [prompt], tokens)
    eng.close()


def _profiled(eng, prompts: list[list[int]], tokens: int) -> None:
    """The generations `summary` keeps (its frame marks the samples)."""
    for prompt in prompts:
        _generate(eng, prompt, tokens)


def _generate(eng, prompt: list[int], new_tokens: int) -> None:
    from engine import GenerationParams
    from engine.tools.bench import timed_generate
    t = timed_generate(eng, prompt, GenerationParams(max_new_tokens=new_tokens, temperature=1.0, seed=0,
                                                      ignore_eos=True))
    if new_tokens > 1:
        print(f"decode {new_tokens} tokens: {t.decode_s / (t.new_tokens - 1) * 1e3:.2f} ms/token", flush=True)
    else:
        print(f"prefill {len(prompt)} tokens: {t.prefill_s * 1e3:.1f} ms ({len(prompt) / t.prefill_s:.0f} tok/s)", flush=True)


def summary(raw_path: str, tokens: int = 256, top: int = 30) -> None:
    inclusive, own, lines, total = Counter(), Counter(), Counter(), 0
    for line in open(raw_path):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        frames = stack.split(";")
        start = next((i for i, f in enumerate(frames) if PHASE_FRAME.match(f)), None)
        if start is None or not any(PROFILED_FRAME.match(f) for f in frames[:start]):
            continue
        n = int(count)
        lines[frames[-1].replace("/work/main/", "")] += n
        frames = [_short(f) for f in frames[start:]]
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not total:
        seen = Counter(f for line in open(raw_path) for f in line.rpartition(" ")[0].split(";") if "runner.py" in f)
        print(f"no {PHASE} samples; the runner's frames sampled: {[f for f, _ in seen.most_common(8)]}")
        return
    print(f"{total} samples in Runner.{PHASE}; share of them (inclusive | self)")
    for frame, n in inclusive.most_common(top):
        print(f"  {n / total:6.1%} | {own[frame] / total:6.1%}  {frame}")
    print("self time, largest:")
    for frame, n in own.most_common(15):
        print(f"  {n / total:6.1%}  {frame}")
    print("self time by line (time in C calls goes to the line that made them):")
    for frame, n in lines.most_common(25):
        print(f"  {n / total:6.1%}  {frame}")


def _short(frame: str) -> str:
    """'fn (path/to/file.py:123)' -> 'fn (file.py)': one row per function, not per line."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1].split(':')[0]})"


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "run":
        run(args[0], *(args[1:2]), *(int(a) for a in args[2:3]))
    else:
        summary(args[0])
