"""llama.cpp's `convert_hf_to_gguf.py` for a checkpoint without a tokenizer (the bench's random presets).

    python -m bench.gguf_convert LLAMA_CPP_SRC HF_DIR OUT.gguf [--outtype q8_0]

The converter reads a tokenizer in its model class's `set_vocab`; a random checkpoint has none, so before
the script runs (runpy, in this process) the class the converter picks gets a `set_vocab` that writes
tokenizer model `no_vocab` and the vocabulary size: llama.cpp then makes that many dummy tokens, and
`llama-bench` feeds random token ids, so nothing else needs a tokenizer. The checkpoint has no MTP (nextn)
layers, so the converter is told so (`no_mtp`, as its `--no-mtp` sets it). Flash-Next's attention layers get their
Hub name back before the converter reads them (`_hub_layer_types`). The tree's own gguf-py is imported (the GPU box
has no internet to install `gguf`).
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path


def _no_vocab(model) -> None:
    model.gguf_writer.add_tokenizer_model("no_vocab")
    model.gguf_writer.add_vocab_size(model.hparams.get("vocab_size") or model.hparams["text_config"]["vocab_size"])


def _hub_layer_types(set_gguf_parameters):
    """transformers renames Flash-Next's "full_attention" layers "indexed_attention" when it loads the config the
    converter reads; the converter gives a compress ratio (QSA, else dense attention) only to the Hub's spelling."""
    def wrapped(model) -> None:
        if types := model.hparams.get("layer_types"):
            model.hparams["layer_types"] = ["full_attention" if t == "indexed_attention" else t for t in types]
        set_gguf_parameters(model)
    wrapped.hub_layer_types = True
    return wrapped


def convert(src: Path, hf_dir: Path, out: Path, outtype: str = "q8_0") -> None:
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    import conversion
    lookup = conversion.get_model_class

    def without_vocab(name: str, mmproj: bool = False):     # families with their own set_vocab (gpt-oss's) included
        model_class = lookup(name, mmproj)
        model_class.set_vocab = _no_vocab
        if not getattr(model_class.set_gguf_parameters, "hub_layer_types", False):
            model_class.set_gguf_parameters = _hub_layer_types(model_class.set_gguf_parameters)
        if model_class.supports_mtp_export:                        # else it looks for MTP layers
            model_class.no_mtp = True
        return model_class
    conversion.get_model_class = without_vocab
    sys.argv = [str(src / "convert_hf_to_gguf.py"), str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    runpy.run_path(sys.argv[0], run_name="__main__")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gguf_convert", description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="llama.cpp source tree (bench/fetch_llamacpp.sh)")
    p.add_argument("hf_dir", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--outtype", default="q8_0")
    a = p.parse_args(argv)
    convert(a.src.resolve(), a.hf_dir, a.out, a.outtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
