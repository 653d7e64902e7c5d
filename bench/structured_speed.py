"""Decode speed with a JSON Schema enforced against without (the structured-output target: within 5%).

    python bench/structured_speed.py MODEL_DIR --device cuda [--tokens 256] [--repeats 3] [--tokenizer DIR]

The bench presets ship no tokenizer: `--tokenizer` takes another model's (the demo's, `sluice demo`), whose ids
are a prefix of the preset's vocabulary, so the schema is enforced over the preset's whole logits row.

Each run generates the same number of tokens (ignore_eos, a schema whose strings never end the answer
early), greedy, after one warm-up run of each; prints the median decode tok/s of both and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import engine
from engine.grammar import grammar_for
from engine.params import GenerationParams

# an open-ended array of objects: the grammar keeps allowing tokens for as long as the run lasts
SCHEMA = {"type": "array", "items": {"type": "object", "additionalProperties": False, "required": ["id", "name"],
                                     "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}}


def decode_tok_s(eng, grammar: str | None, tokens: int) -> float:
    params = GenerationParams(max_new_tokens=tokens, temperature=0.0, grammar=grammar, ignore_eos=True)
    first = last = None
    count = 0
    for event in eng.generate([{"role": "user", "content": "List some items as JSON."}], params):
        now = time.perf_counter()
        first = first or now
        last, count = now, count + 1
    return (count - 1) / (last - first) if count > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", help="a model dir whose tokenizer to use (for a bench preset, which has none)")
    args = ap.parse_args()
    eng = engine.load(args.model_dir, device=args.device)
    if args.tokenizer:
        from transformers import AutoTokenizer
        eng.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        eng.eos_token_ids = {eng.tokenizer.eos_token_id}     # the preset's own EOS lies past the lent vocabulary
    grammar = grammar_for({"type": "json_schema", "json_schema": {"schema": SCHEMA}})
    try:
        runs = {"plain": [], "schema": []}
        for g in (None, grammar):
            decode_tok_s(eng, g, 16)                                  # warm-up
        for _ in range(args.repeats):                                 # interleaved: drift hits both alike
            for name, g in (("plain", None), ("schema", grammar)):
                runs[name].append(decode_tok_s(eng, g, args.tokens))
        plain, schema = statistics.median(runs["plain"]), statistics.median(runs["schema"])
        print(f"decode without schema: {plain:.2f} tok/s   with JSON Schema: {schema:.2f} tok/s   "
              f"ratio {schema / plain:.3f} ({args.tokens} tokens, median of {args.repeats}, {args.device})")
    finally:
        eng.close()


if __name__ == "__main__":
    main()
