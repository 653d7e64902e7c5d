"""bench/gguf_convert.py on a tiny qwen4_exp checkpoint as the bench writes it: llama.cpp's converter takes it (one
PLE layer, as Flash-Next has; QSA layers keep their compress ratio) and the GGUF holds what llama.cpp's loader
asks for. Needs the llama.cpp tree in peer/ (bench/fetch_llamacpp.sh), not a build. llama-bench ran this tiny
model's GGUF on the CPU (2026-12-06), and its greedy tokens matched transformers' while the context was within
the indexer's budget."""
import json
import subprocess
import sys

import pytest

from bench.llamacpp import default_src
from engine.tools import presets
from tests.families.qwen4_models import TEXT

SRC = default_src()
# what llama.cpp's qwen4exp loader asks of the model, as the released one has it: one PLE layer (1-based 3, a
# DeltaNet layer), the PLE width the hidden size, value heads as wide as key heads, mrope sections that sum to the
# rotary pairs (the converter writes Qwen3.5's [11, 11, 10] where none is given)
LOADABLE = dict(ple_layer_ids=[3], ple_embed_dim=64, linear_value_head_dim=16,
                rope_parameters={**TEXT["rope_parameters"], "mrope_section": [2, 1, 1]})
pytestmark = pytest.mark.skipif(not (SRC / "convert_hf_to_gguf.py").is_file(), reason="no llama.cpp tree in peer/")

# the converter and gguf-py run in their own process: they put the tree on sys.path and replace sys.argv
READ = """import json, sys
sys.path.insert(0, sys.argv[1])
import gguf
r = gguf.GGUFReader(sys.argv[2])
keys = ("general.architecture", "tokenizer.ggml.model", "qwen4exp.attention.compress_ratios", "qwen4exp.ple.layers",
        "qwen4exp.ple.head_offsets", "qwen4exp.ple.head_vocab_sizes", "qwen4exp.rope.dimension_sections")
print(json.dumps({"fields": {k: r.fields[k].contents() for k in keys},
                  "tensors": {t.name: [t.shape.tolist(), t.tensor_type.name] for t in r.tensors}}))
"""


def test_tiny_flash_next_converts_to_a_gguf_llama_cpp_reads(monkeypatch, tmp_path):
    monkeypatch.setitem(presets.PRESETS, "tiny-q4", {"model_type": "qwen4_exp_text", **TEXT, **LOADABLE})
    hf_dir = presets.write_hf_checkpoint("tiny-q4", tmp_path / "hf", device="cpu", progress=lambda _: None)
    out = tmp_path / "tiny.gguf"
    subprocess.run([sys.executable, "-m", "bench.gguf_convert", str(SRC), str(hf_dir), str(out)], check=True,
                   capture_output=True)
    read = subprocess.run([sys.executable, "-c", READ, str(SRC / "gguf-py"), str(out)], check=True,
                          capture_output=True, text=True)
    g = json.loads(read.stdout)
    f, tensors = g["fields"], g["tensors"]
    assert f["general.architecture"] == "qwen4exp" and f["tokenizer.ggml.model"] == "no_vocab"
    assert f["qwen4exp.attention.compress_ratios"] == [0, 4, 0, 4]          # QSA on the indexed layers, not dense
    assert f["qwen4exp.ple.layers"] == [2] and f["qwen4exp.rope.dimension_sections"] == [2, 1, 1, 0]
    # the table: the 4 shards in one tensor, its rows covering every head's range; rows of 16 are no Q8_0 blocks
    rows = max(o + v for o, v in zip(f["qwen4exp.ple.head_offsets"], f["qwen4exp.ple.head_vocab_sizes"]))
    assert tensors["per_layer_token_embd.weight"] == [[16, 416], "F16"] and rows <= 416
    assert sum(".ffn_gate_exps." in n for n in tensors) == 4 and tensors["token_embd.weight"][1] == "Q8_0"
    assert len(tensors) == 114              # every tensor of the 4 layers: none left out, none twice
