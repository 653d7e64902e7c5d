"""The transformers reference: the same checkpoint in float32, eager experts and attention."""
from __future__ import annotations

import torch

from engine.format.quant import dequantize, quantize
from engine.model.spec import read_spec


def load_reference(hf_dir, quant: str = "bf16", dense_quant: str | None = None):
    """transformers model on hf_dir; with quant != bf16 its routed experts hold the dequantized weights,
    with dense_quant "int8" the dense weights its family quantises (engine.model.dense_quant) too."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    import glob

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, experts_implementation="eager",
                                                 attn_implementation="eager", **_dequantized(hf_dir)).eval()
    spec = read_spec(hf_dir)
    if dense_quant:
        _quantize_dense(model, spec.family, dense_quant)
    if quant == "bf16":
        return model
    if spec.family == "gpt_oss":
        _quantize_gpt_oss_experts(model, quant)
        return model
    if spec.family == "llama4_text":
        _quantize_llama4_experts(model, spec.moe_layers, quant)
        return model
    if spec.generic is not None or spec.family == "nemotron_h":     # Nemotron-H: transformers' ungated experts module
        from engine.model.generic.scan import read_interface
        _quantize_module_experts(model, spec.generic or read_interface(spec.cfg), quant)
        return model
    stored = {}
    for f in glob.glob(f"{hf_dir}/*.safetensors"):
        with safe_open(f, "pt") as s:
            stored.update({k: s.get_tensor(k) for k in s.keys() if ".experts." in k})
    with torch.no_grad():
        for layer in spec.moe_layers:
            experts = model.model.layers[layer].mlp.experts
            for e in range(spec.num_experts):
                w = {p: dequantize(quantize(stored[spec.expert_tensor_name(layer, e, p)], quant), quant)
                     for p in ("gate", "up", "down")}
                experts.gate_up_proj[e].copy_(torch.cat([w["gate"], w["up"]], dim=0))
                experts.down_proj[e].copy_(w["down"])
    return model


def _quantize_module_experts(model, interface, quant: str) -> None:
    """A generic family's experts as transformers holds them (gate_up_proj [E, 2I, H] and down_proj [E, H, I], or
    transposed, gate and up concatenated or interleaved; ungated: up_proj [E, I, H] alone): each expert's gate, up
    and down [out, in] quantised on its own, as repack does."""
    modules = dict(model.named_modules())
    I = interface.intermediate
    gate_rows, up_rows = (slice(0, I), slice(I, 2 * I)) if interface.is_concatenated else (slice(0, None, 2),
                                                                                          slice(1, None, 2))
    row_groups = (gate_rows, up_rows) if interface.has_gate else (slice(None),)
    round_trip = lambda w: dequantize(quantize(w.contiguous(), quant), quant)         # noqa: E731
    with torch.no_grad():
        for path in interface.paths.values():
            experts = modules[path]
            for e in range(interface.num_experts):
                gate_up = experts.gate_up_proj[e] if interface.has_gate else experts.up_proj[e]
                down = experts.down_proj[e]
                if interface.is_transposed:
                    gate_up, down = gate_up.T, down.T                             # views: [2I, H], [H, I]
                for rows in row_groups:
                    gate_up[rows].copy_(round_trip(gate_up[rows]))
                down.copy_(round_trip(down))


def _quantize_gpt_oss_experts(model, quant: str) -> None:
    """gpt-oss holds its experts fused ([H, 2I], gate/up interleaved; [I, H]): each of gate, up and down
    quantised on its own, as repack does."""
    with torch.no_grad():
        for layer in model.model.layers:
            experts = layer.mlp.experts
            for e in range(experts.num_experts):
                gate_up = experts.gate_up_proj[e]                                   # [H, 2I], gate/up interleaved
                round_trip = lambda w: dequantize(quantize(w.T, quant), quant).T    # noqa: E731  [in, out] -> same
                gate_up[:, 0::2], gate_up[:, 1::2] = round_trip(gate_up[:, 0::2]), round_trip(gate_up[:, 1::2])
                experts.down_proj[e] = round_trip(experts.down_proj[e])


def _quantize_llama4_experts(model, moe_layers, quant: str) -> None:
    """Llama 4 holds its experts fused and transposed (gate_up [H, 2I]: gate columns, then up; down [I, H]): each
    of gate, up and down quantised on its own, as repack does."""
    round_trip = lambda w: dequantize(quantize(w.T.contiguous(), quant), quant).T     # noqa: E731  [in, out] -> same
    with torch.no_grad():
        for layer in moe_layers:
            experts = model.model.layers[layer].feed_forward.experts
            I = experts.expert_dim
            for e in range(experts.num_experts):
                gate_up = experts.gate_up_proj[e]                                   # [H, 2I]
                gate_up[:, :I], gate_up[:, I:] = round_trip(gate_up[:, :I]), round_trip(gate_up[:, I:])
                experts.down_proj[e] = round_trip(experts.down_proj[e])


def _quantize_dense(model, family: str, dense_quant: str) -> None:
    """family: the checkpoint's (Qwen3.5's text model says `qwen3_5_moe_text`; its names are the Sluice dir's)."""
    from engine.model import dense_quant as dq
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in dq.quantized_names(family, params):
            params[name].copy_(dequantize(quantize(params[name], dense_quant), dense_quant))


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0, min_new_tokens=max_new_tokens)
    return out[0, len(prompt_ids):].tolist()


def _dequantized(hf_dir) -> dict:
    """An FP8 checkpoint (DeepSeek-V4-Flash's) read into dequantised weights wherever the test runs: without
    this, transformers on a machine with a GPU keeps them as FP8 for its own kernels (and needs the HF
    `kernels` package for them; run 57), where a machine without one dequantises them."""
    import json
    from pathlib import Path
    quant = json.loads((Path(hf_dir) / "config.json").read_text()).get("quantization_config") or {}
    if quant.get("quant_method") != "fp8":
        return {}
    from transformers import FineGrainedFP8Config
    return {"quantization_config": FineGrainedFP8Config(dequantize=True,
                                                        modules_to_not_convert=quant.get("modules_to_not_convert"))}

