"""Sluice engine: headless, never imports Qt.

Public API (the GUI, CLI and server use only this):

    from engine import load, GenerationParams, SluiceError
    eng = load(model_dir, device="cpu", vram_budget="2GB", ram_cache="4GB")
    for event in eng.generate([{"role": "user", "content": "Hi"}], GenerationParams(max_new_tokens=64)):
        print(event.text, end="")
    eng.cancel()        # from any thread; generation stops within one token
    eng.telemetry()     # thread-safe dict snapshot (schema: engine.runtime.telemetry), derived figures included
    interval_figures(before, after, dt_s)   # rates and hit rate between two snapshots (the live panels' plots)

The app's hub, estimate, repack, demo and server needs go through one more module, engine.setup.
    eng.close()
"""
from engine.errors import SluiceError, user_sentence
from engine.params import GenerationParams, TokenEvent
from engine.sizes import format_size, parse_size


def load(model_dir, device: str = "cpu", vram_budget=None, ram_cache=None, dtype=None, progress=None,
         max_context: int | None = None, cpu_experts: str | None = None, dense_quant: str | None = None,
         options=None):
    """Open a Sluice model dir (or a Hugging Face snapshot, repacked on the fly) and return an Engine.
    max_context: prompt + answer tokens; default the model's own limit cut to what the VRAM budget holds.
    cpu_experts: "auto" (GPU: the CPU computes the RAM-resident experts the cost model gives it), "all",
    or "off"; given, it wins over options.cpu_experts. dense_quant: "int8" keeps the dense weights as int8
    (half their VRAM goes to expert slots). options: engine.options.Options, the tunables (eager, ...)."""
    from engine.engine import Engine
    return Engine.load(model_dir, device=device, vram_budget=vram_budget, ram_cache=ram_cache,
                       dtype=dtype, progress=progress, max_context=max_context, cpu_experts=cpu_experts,
                       dense_quant=dense_quant, options=options)


def interval_figures(before: dict, after: dict, dt_s: float) -> dict:
    """Disk and host->device GB/s and the RAM hit rate between two telemetry snapshots dt_s apart."""
    from engine.runtime.telemetry import interval_figures as figures
    return figures(before, after, dt_s)


__all__ = ["load", "GenerationParams", "TokenEvent", "SluiceError", "user_sentence", "format_size", "parse_size",
           "interval_figures"]
