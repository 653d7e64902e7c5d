"""DeepSeek-V4 pieces (pure torch): mHC residual streams, shared-KV attention with compressed and
sparse long-range entries, hash / score routing, clamped SwiGLU. See docs/families/deepseek_v4.md."""
