"""A user's first prompt after a pause, with and without the background RAM fill (Experts.fill): TTFT and what the
prompt read from the disk, through Engine.generate, and how long the idle engine took to fill RAM.

    .venv/bin/python scripts/probe_ram_fill.py MODEL_DIR [--device cpu] [--pause 12] [--prompt-tokens 64]

Each setting loads the model in a child process of its own (SLUICE_RAM_FILL=0, then the default), waits `pause`
seconds as a user typing would, then sends one random prompt for one token.
"""
from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(model: str, device: str, pause: float, prompt_tokens: int) -> None:
    sys.path.insert(0, str(ROOT))
    import engine
    from engine import GenerationParams
    eng = engine.load(model, device=device, dense_quant="int8", max_context=prompt_tokens + 16)
    loaded = time.perf_counter()
    try:
        filled_s = None
        while time.perf_counter() - loaded < pause:               # the user types
            if filled_s is None and eng._filler is not None and not eng._filler.is_alive():
                filled_s = time.perf_counter() - loaded
            time.sleep(0.05)
        before = eng.telemetry()
        rng = random.Random(0)
        prompt = [rng.randrange(eng.spec.vocab_size) for _ in range(prompt_tokens)]
        start = time.perf_counter()
        for _ in eng.generate(prompt, GenerationParams(max_new_tokens=1, temperature=0)):
            ttft = time.perf_counter() - start
        after = eng.telemetry()
    finally:
        eng.close()
    ram = before["ram_cache"]
    print(f"SLUICE_RAM_FILL={os.environ.get('SLUICE_RAM_FILL', '(default)')}: after {pause:g} s idle the RAM cache held "
          f"{ram['used_bytes'] / 1e9:.2f} GB ({ram['fill_reads']} blocks filled"
          + (f", all in {filled_s:.1f} s" if filled_s else "") + f"); a {prompt_tokens}-token prompt: TTFT {ttft:.2f} s, "
          f"{(after['disk']['bytes_read'] - before['disk']['bytes_read']) / 1e9:.2f} GB read from the disk for it", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--pause", type=float, default=12.0)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        one(args.model, args.device, args.pause, args.prompt_tokens)
        return
    for setting in ("0", None):
        env = {**os.environ}
        env.pop("SLUICE_RAM_FILL", None)
        if setting is not None:
            env["SLUICE_RAM_FILL"] = setting
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child"], env=env, check=False)


if __name__ == "__main__":
    main()
