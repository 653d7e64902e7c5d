"""A model as the runtime sees it: embedding, blocks (engine.model.block), final norm and head, and
the math of one routed expert. Built once per family from the dense weights (engine.model.families)."""
from __future__ import annotations

from typing import Callable

import torch

from engine.model.families import family_module
from engine.model.layers import Packed, RmsNorm, embedding, linear, swiglu_mlp
from engine.model.spec import ModelSpec
from engine.model.state import StateSpec
from kernels.activation import SILU, Activation

EMBED_TABLE = "model.embed_tokens.weight"


def table_in_file(family: str, tied: bool) -> bool:
    """Whether the embedding table stays in the file: where the head has its own weight and the family embeds
    by a plain row lookup. The runner and both planners ask."""
    return not tied and not getattr(family_module(family), "EMBEDS_ITSELF", False)


def swiglu_expert(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """One routed expert: x [T, H] and its dequantised gate/up [I, H], down [H, I] -> [T, H]."""
    return swiglu_mlp(x, w["gate"], w["up"], w["down"])


class Model:
    graph_safe = True        # False: the family's blocks need host-known positions (decode runs eagerly)
    runs_passes = False      # True: the model runs whole passes itself (engine.model.generic), not block by block
    norm_type = RmsNorm      # what the final norm's weight becomes (a family's own: (1 + w) norms)

    def __init__(self, spec: ModelSpec, blocks: list, embed_tokens: torch.Tensor, final_norm: torch.Tensor,
                 lm_head: torch.Tensor, eps: float, expert_mlp: Callable = swiglu_expert,
                 expert_kernel: Activation | None = SILU):
        self.spec, self.blocks = spec, blocks
        self.embed_tokens, self.final_norm, self.lm_head = embed_tokens, self.norm_type(final_norm, eps), lm_head
        self.expert_mlp = expert_mlp
        self.expert_kernel = expert_kernel      # the Triton MoE kernels' activation for expert_mlp, None: torch only

    @property
    def embed_in_ram(self) -> bool:
        """Whether the embedding table stays in the model's file: the runner left a table read by row
        (engine.format.file_table), not a tensor."""
        return not isinstance(self.embed_tokens, (torch.Tensor, Packed))

    def state_specs(self) -> list[dict[str, StateSpec]]:
        return [block.state_specs() for block in self.blocks]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.embed_in_ram:                                              # rows read from the file
            return self.embed_tokens.rows(token_ids.cpu()).to(token_ids.device)
        return embedding(token_ids, self.embed_tokens)                     # [T] -> [T, H]

    def before_step(self, token: int, position: int) -> None:
        """Host work a decode step starts before its pieces run, the token known on the host (qwen4_exp: the
        n-gram lookups); none by default."""

    def before_layer(self, layer: int) -> None:
        """Host work done before a decode step's layer runs or replays (qwen4_exp: a PLE layer's rows copied
        into its static input); none by default."""

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The residual stream [T, H] -> logits of its last token [V], float32."""
        return linear(self.final_norm(x[-1:]), self.lm_head)[0].float()
