"""The generic path: MoE families without a native Sluice module run as transformers' own modules.

The dense parts (embeddings, any attention or recurrent mixer, norms, routers, shared experts) are
transformers' modules built from the config, with the checkpoint's dense weights and their own cache;
every routed-experts module is replaced by an adapter that hands its tokens, routing ids and weights
to Sluice's streaming experts (engine.runtime.experts: the same tiers, budgets, prefetch, telemetry).

  scan.py     the model's experts modules, read from the config alone (a model built on the meta device)
  adapter.py  the module that stands in for a family's experts, and the experts' math
  model.py    the transformers model with its experts replaced: prefill and decode passes
  graphs.py   its decode as CUDA graph segments split at the experts, for the families that allow it
"""
