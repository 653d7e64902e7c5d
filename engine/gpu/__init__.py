"""The CUDA path: pinned RAM cache buffers, overlapped expert streaming into two VRAM slot banks,
speculative prefetch, fused Triton expert kernels and CUDA-graph dense decode.

Every piece also runs on the CPU (synchronous copies, torch reference math), so the logic is tested
in CI without a GPU; the GPU tests (marked `gpu`) and scripts/gpu_check.py cover the CUDA side.
"""
