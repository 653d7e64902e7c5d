"""The kernel warm-up's child process (engine.runtime.kernel_warmup runs it once per machine, model and setting):
load the model as the parent will, run one prompt, exit; the kernels' verdicts and compiled code stay on disk."""
from __future__ import annotations

import argparse
import sys

import engine
from engine.format import modeldir
from engine.options import Options
from engine.params import GenerationParams
from engine.runtime.kernel_warmup import PROMPT_TOKENS


def main(argv: list[str] | None = None) -> int:
    """The child: load the model as the parent will, run one prompt, exit (its caches stay on disk)."""
    parser = argparse.ArgumentParser(prog="python -m engine.tools.kernel_warmup")
    parser.add_argument("model_dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--dense-quant", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine option")
    args = parser.parse_args(argv)
    options = Options.parse(args.set, base=Options(kernel_warmup=False))
    model = modeldir.open_model_dir(args.model_dir)
    eng = engine.load(args.model_dir, device=args.device, dtype=args.dtype, dense_quant=args.dense_quant,
                      max_context=PROMPT_TOKENS + 4, ram_cache=4 * model.spec.top_k * model.layout.block_bytes,
                      options=options)
    ids = [i % model.spec.vocab_size for i in range(1, PROMPT_TOKENS + 1)]
    try:
        for _ in eng.generate(ids, GenerationParams(max_new_tokens=2, temperature=0.0)):
            pass
    finally:
        eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
