"""How the decode's CUDA graphs are captured: "thread_local" error mode, so that only the capturing thread's own
calls can break a capture. The default ("global") fails a capture when any thread of the process makes a call the
driver deems unsafe meanwhile: a reader thread, the RAM cache's chunk being page-locked ahead on its own thread,
or a previous engine's threads winding down (a model switch). On an H100 a gpt-oss load failed its expert graphs'
capture so, in a test process that had loaded engines before."""
from __future__ import annotations

import torch

CAPTURE_MODE = "thread_local"


def capturing(graph: torch.cuda.CUDAGraph, pool) -> torch.cuda.graph:
    """`with capturing(graph, pool): ...` records what the block enqueues on the current thread into `graph`."""
    return torch.cuda.graph(graph, pool=pool, capture_error_mode=CAPTURE_MODE)
