"""qwen4_exp (Qwen3.8-Flash-Next): its pieces beyond the Gated-DeltaNet hybrids (engine.model.families.hybrid).
config: the dimensions; hyper: gated hyper-connections; ngram_hash: PLE's hashed n-gram row ids;
ple: the per-layer-embedding injection; qsa: the indexed attention."""
