"""Config quirks of the Gated-DeltaNet hybrids (qwen3_next, qwen3_5_moe): which layers are DeltaNet
("linear_attention") and which gated full attention, and the DeltaNet dimensions."""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import SluiceError

LINEAR, FULL = "linear_attention", "full_attention"


@dataclass(frozen=True)
class HybridDims:
    layer_types: tuple[str, ...]   # per layer: LINEAR (Gated DeltaNet) or FULL (gated attention)
    num_k_heads: int               # DeltaNet query/key heads
    num_v_heads: int               # DeltaNet value heads (a multiple of num_k_heads)
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int               # width of the short causal depthwise convolution
    rotary_dim: int                # the rotated part of a full-attention head (partial rotary)

    @property
    def conv_channels(self) -> int:
        return 2 * self.num_k_heads * self.k_head_dim + self.num_v_heads * self.v_head_dim

    def is_linear(self, layer: int) -> bool:
        return self.layer_types[layer] == LINEAR


def read_hybrid_dims(cfg) -> HybridDims:
    """cfg: the transformers text config (layer_types is filled from full_attention_interval when absent)."""
    types = tuple(cfg.layer_types)
    unknown = sorted(set(types) - {LINEAR, FULL})
    if unknown or len(types) != cfg.num_hidden_layers:
        raise SluiceError(f"This {cfg.model_type} model has layer types {unknown or 'of the wrong count'} that Sluice "
                          "does not run (it runs linear_attention and full_attention layers); use another model.")
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise SluiceError("This model's DeltaNet value heads are not a multiple of its key heads; the config.json "
                          "is damaged or of an unknown variant.")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    partial = (cfg.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    return HybridDims(layer_types=types, num_k_heads=cfg.linear_num_key_heads, num_v_heads=cfg.linear_num_value_heads,
                      k_head_dim=cfg.linear_key_head_dim, v_head_dim=cfg.linear_value_head_dim,
                      conv_kernel=cfg.linear_conv_kernel_dim, rotary_dim=int(head_dim * partial))
