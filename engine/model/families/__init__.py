"""Model families: one descriptor each (checkpoint naming, expert layout, the module that runs it).

Each family module provides
    read_spec(cfg) -> ModelSpec                      its config quirks (cfg: the transformers config)
    state_specs(spec) -> [ {name: StateSpec} ]       per-layer state, from the config alone (estimate)
    build(spec, weights, dtype, device) -> Model     its blocks over the dense weights
    refuse_unhandled(config) (optional)              one sentence for a variant it cannot run exactly
A new family is one module plus one Family here (modules are imported on first use: this file imports
nothing of the model, so engine.model.spec and engine.format can read the descriptors).

    family = FAMILIES["mixtral"]
    family.expert_prefix, family.expert_proj["gate"], family.has_expert_bias     # "block_sparse_moe", "w1", False

Families with module "generic" run as transformers' own modules with streamed experts (engine.model.generic):
token for token the same, slower (no fused dense kernels; CUDA graphs only where the layers allow, see
engine.model.generic.graphs), which `path` says to the user. A model
type listed nowhere here is added as generic when it is first read, where transformers knows it and its experts
fit the generic path (engine.model.spec.hf_config): a family transformers adds runs on day 0.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

_W123 = {"gate": "w1", "up": "w3", "down": "w2"}     # Mixtral-style checkpoint names of gate, up, down
GENERIC_PATH = "generic (slower)"


# transformers families whose experts use its shared experts interface, each tested token for token
GENERIC_FAMILIES = ("afmoe", "hy_v3", "mimo_v2_flash", "lfm2_moe", "granitemoehybrid", "kimi_linear",
                    "bailing_hybrid", "longcat_flash")
GENERIC_VL_FAMILIES = ("qwen3_vl_moe", "glm4v_moe", "minimax_m3_vl", "glm5_next", "kimi_k25")


@dataclass(frozen=True)
class Family:
    model_type: str                      # config.json's model_type
    module: str                          # engine.model.families.<module> runs it
    expert_prefix: str = "mlp"           # checkpoint module name of the MoE block
    expert_proj: dict[str, str] = field(default_factory=lambda: {p: f"{p}_proj" for p in ("gate", "up", "down")})
    text_prefix: str = "model."          # checkpoint prefix of the text model
    has_expert_bias: bool = False        # experts add a bias to gate, up and down (blocks carry bias fields)
    has_expert_gate: bool = True         # False: an expert is down(act(up x)), its blocks up and down alone

    @property
    def is_generic(self) -> bool:
        return self.module == "generic"

    @property
    def path(self) -> str:
        """How Sluice runs it, as the catalog and the estimate say: "native" or GENERIC_PATH."""
        return GENERIC_PATH if self.is_generic else "native"


FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen3_moe", "standard"), Family("mixtral", "standard", "block_sparse_moe", _W123),
    Family("olmoe", "standard"), Family("qwen2_moe", "standard"),
    # Gated-DeltaNet hybrids
    Family("qwen3_next", "hybrid"), Family("qwen3_5_moe", "hybrid", text_prefix="model.language_model."),
    Family("qwen3_5_moe_text", "hybrid"),          # the text model saved on its own
    # DeepSeek-style: MLA or GQA, grouped sigmoid/softmax routers, shared experts, leading dense layers
    Family("deepseek_v2", "deepseek_style"), Family("deepseek_v3", "deepseek_style"),
    Family("glm4_moe", "deepseek_style"), Family("glm4_moe_lite", "deepseek_style"),
    Family("minimax_m2", "deepseek_style", "block_sparse_moe", _W123), Family("dots1", "deepseek_style"),
    # DeepSeek Sparse Attention: MLA over the keys a lightning indexer picks (DeepSeek-V3.2, GLM-5)
    Family("deepseek_v32", "deepseek_style"), Family("glm_moe_dsa", "deepseek_style"),
    # GQA with interleaved rope, a softmax router with a correction bias, shared experts
    Family("ernie4_5_moe", "ernie"),
    Family("gpt_oss", "gpt_oss", has_expert_bias=True),
    # RoPE and NoPE layers, chunked attention, experts fed inputs scaled by their sigmoid scores, a shared expert
    Family("llama4_text", "llama4", "feed_forward"),
    Family("llama4", "llama4", "feed_forward", text_prefix="language_model."),     # its language model and head
    Family("deepseek_v4", "deepseek_v4", "ffn", _W123),
    # hybrids with hyper-connections, per-layer n-gram embeddings and QSA indexed attention
    Family("qwen4_exp", "qwen4_exp", text_prefix="model.language_model."), Family("qwen4_exp_text", "qwen4_exp"),
    # Mamba-2, attention without rope, MoE and MLP layers; ungated relu² experts; the text model is `backbone.`
    Family("nemotron_h", "nemotron_h", "mixer", text_prefix="backbone.", has_expert_gate=False),
    # generic: transformers' modules, Sluice's streamed experts
    *(Family(name, "generic") for name in GENERIC_FAMILIES),
    # vision-language checkpoints: their language model, generically (images are refused in one sentence)
    *(Family(name, "generic", text_prefix="model.language_model.") for name in GENERIC_VL_FAMILIES),
)}
# Neighbours of supported families whose extra machinery Sluice does not run: refused before any download
# (model_type -> one sentence); none at present.
UNHANDLED_VARIANTS: dict[str, str] = {}


def family_module(model_type: str) -> ModuleType:
    return importlib.import_module(f"engine.model.families.{FAMILIES[model_type].module}")
