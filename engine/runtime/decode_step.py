"""A one-token decode step as static-shape pieces over the model's blocks, captured in CUDA graphs.

Piece L starts from the previous layer's results (layer 0: the embedding of the step's token), so the
residual add after a MoE block (and its shared expert) happens inside the next piece: per MoE layer
the host does one graph replay, one read of the expert ids and the expert launch(es). Piece L runs
the block's mixer and, for a MoE layer, its router, with the speculated ids of the next MoE layer
(that layer's own router on this layer's input, best guess first) appended. A last piece gives the logits. The routed experts of layer L write the static `moe_out[L]`. What every layer computes
alike from the step's position (rope cos/sin, `Step.memo`) is computed by the first layer that asks and
read by the others, as in a prompt's pass (in graphs: the first graph's buffers).
A family's host work (qwen4_exp's n-gram rows) goes in the model's hooks: `before_step` as the step is set, and
`before_layer` before each layer runs or replays, filling the static buffers its pieces read.
On CUDA the state is static (allocated at full size, graph-safe); elsewhere, and with
`use_graphs=False` (the switch to bisect a graph bug), the very same functions run eagerly.
"""
from __future__ import annotations

import torch

from engine.model.block import Step
from engine.model.graph_capture import capturing
from engine.model.model import Model
from engine.model.state import ModelState


class LayerOutputs:
    def __init__(self):
        self.x = self.h = self.rows = self.route_weights = self.ids = None     # rows: the experts' input


class DecodeStep:
    def __init__(self, model: Model, state: ModelState, device: torch.device, use_graphs: bool = True):
        self.model, self.state, self.blocks = model, state, model.blocks
        self.device = torch.device(device)
        self.use_graphs = use_graphs and self.device.type == "cuda"
        # [token, position] of the step, written before each step (through a pinned row on CUDA)
        self.step_in = torch.zeros(2, dtype=torch.long, device=self.device)
        self.token_in, self.position = self.step_in[0:1], self.step_in[1:2]
        self._step_stage = torch.zeros(2, dtype=torch.long).pin_memory() if self.device.type == "cuda" else None
        self._start: int | None = None        # the step's position on the host (eager, growing state only)
        # An embedding table left in the file: the step's row is read on the host and copied in (pinned).
        self.x_in = self._x_stage = None
        if model.embed_in_ram:
            self.x_in = torch.zeros(1, model.spec.hidden_size, dtype=model.embed_tokens.dtype, device=self.device)
            self._x_stage = torch.zeros(self.x_in.shape, dtype=self.x_in.dtype,
                                        pin_memory=self.device.type == "cuda")
        self.out = [LayerOutputs() for _ in self.blocks]
        moe = [i for i, b in enumerate(self.blocks) if b.is_moe]
        self.moe_out = {i: torch.zeros(self.blocks[i].expert_rows_per_token, model.spec.hidden_size,
                                       dtype=torch.float32, device=self.device) for i in moe}
        self.next_moe = {i: next((m for m in moe if m > i), None) for i in range(len(self.blocks))}
        self.logits = None
        self._graphs: list[torch.cuda.CUDAGraph] | None = None
        # The step's values every layer shares (Step.memo: rope cos/sin): the first layer that asks computes
        # them, the others read them. Eagerly a new Step each token; in graphs one Step made before capture,
        # so the first graph that asks computes them at every replay and the later graphs read its buffers.
        self._step = Step(self.position, None, state, decode=True)

    def set_step(self, token: int, position: int) -> None:
        """The next step's input token and position. The pinned row is reused only after the caller
        has read the previous step's result (a host sync), so its copy has long finished."""
        self.model.before_step(token, position)           # first: its host reads overlap what follows
        self._start = None if self.state.static and self.use_graphs else position
        if self._graphs is None:
            self._step = Step(self.position, self._start, self.state, decode=True)
        if self.x_in is not None:
            self.model.embed_tokens.row_into(token, self._x_stage)
            self.x_in.copy_(self._x_stage, non_blocking=True)
        if self._step_stage is None:
            self.step_in.copy_(torch.tensor([token, position]))
            return
        self._step_stage.numpy()[:] = (token, position)
        self.step_in.copy_(self._step_stage, non_blocking=True)

    def _residual(self, layer: int) -> torch.Tensor:
        o, block = self.out[layer], self.blocks[layer]
        return block.combine(o.x, o.h, self.moe_out[layer]) if block.is_moe else o.x

    # ---------------------------------------------------------------- the captured pieces
    def _layer(self, layer: int) -> None:
        block, o = self.blocks[layer], self.out[layer]
        if layer:
            x = self._residual(layer - 1)
        else:
            x = self.x_in if self.x_in is not None else self.model.embed(self.token_in)
        x, h = block.mix(x, self._step)
        if not block.is_moe:
            o.x = block.combine(x, h, None)
            return
        o.x, o.h = x, h
        # rows [R, H], weights and ids [R, K / R] (R = block.expert_rows_per_token: 1, or Llama 4's top-k)
        o.rows, o.route_weights, route_ids = block.expert_rows(h, *block.route(h))
        o.ids = route_ids.flatten()                    # routed ids, then the speculated ids of the next MoE layer
        nxt = self.next_moe[layer]
        if nxt is not None:                            # the guesses best first (some routers pick unsorted)
            guess_weights, guess_ids = self.blocks[nxt].route(h)
            if getattr(getattr(self.blocks[nxt], "router", None), "best_first", False):
                o.ids = torch.cat([o.ids, guess_ids[0]])          # no sort: its CUDA module need not load
            else:
                order = torch.argsort(guess_weights, dim=-1, descending=True)
                o.ids = torch.cat([o.ids, guess_ids[0][order[0]]])     # indexing, not gather: one module fewer

    def _head(self) -> None:
        self.logits = self.model.head(self._residual(len(self.blocks) - 1))

    # ---------------------------------------------------------------- driving
    def _pieces(self) -> list:
        return [lambda layer=layer: self._layer(layer) for layer in range(len(self.blocks))] + [self._head]

    def capture(self) -> None:
        """Record one graph per layer and one for the head (shared memory pool). Capture writes
        garbage state at the current position, which the next real step overwrites."""
        if not self.use_graphs:
            return
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):                       # warm-up: allocator and library handles
            for piece in self._pieces():
                piece()
        torch.cuda.current_stream().wait_stream(stream)
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        self._step = Step(self.position, None, self.state, decode=True)   # the warm-up's values were computed outside
        for piece in self._pieces():
            graph = torch.cuda.CUDAGraph()
            with capturing(graph, pool):
                piece()
            graphs.append(graph)
        self._graphs = graphs

    def run_layer(self, layer: int) -> LayerOutputs:
        self.model.before_layer(layer)
        if self._graphs is not None:
            self._graphs[layer].replay()
        else:
            self._layer(layer)
        return self.out[layer]

    def run_head(self) -> None:
        """The step's logits [V] float32."""
        if self._graphs is not None:
            self._graphs[-1].replay()
        else:
            self._head()
