"""The setup facade: what the app uses besides the runtime API of `engine` (load, GenerationParams, ...).

Hub search and download, the fit and speed estimate, repack, the demo model, the local server and the CLI
entry, re-exported by name so the app never reaches into engine internals (tests/test_layering.py checks
it). Names resolve on first use: the GUI starts without importing the hub, torch or the server.
"""
from __future__ import annotations

import importlib

_SOURCES = {
    "engine.hub.search": ("search", "repo_info", "supported_families", "save_token", "parse_repo_ref"),
    "engine.hub.download": ("download", "missing_bytes", "free_disk_bytes", "STATE_DIR", "DownloadStopped"),
    "engine.plan.estimate": ("Machine", "QUANTS", "estimate", "estimate_model_dir", "format_params",
                             "model_shape"),
    "engine.plan.hardware": ("probe", "format_cpu_list", "pin_current_thread_to_performance_cores"),
    "engine.format.repack": ("repack", "RepackCancelled"),
    "engine.format.modeldir": ("is_model_dir", "open_model_dir"),
    "engine.format.manifest_schema": ("check_manifest",),
    "engine.model.spec": ("load_config_dict", "read_spec"),
    "engine.tools.user_models": ("data_root",),
    "engine.tools.demo": ("build_demo_model", "demo_load_options", "DEMO_DIR_NAME"),
    "engine.serve": ("GenerationQueue", "Server", "is_loopback"),
    "engine.serve.service": ("served_model_id",),
    "engine.grammar": ("grammar_for", "response_format_for_setting", "check_setting"),
}
_MODULE_OF = {name: module for module, names in _SOURCES.items() for name in names}
_RENAMED = {"dense_quant_available": "available", "run_cli": "main"}
_MODULE_OF.update(dense_quant_available="engine.model.dense_quant", run_cli="engine.tools.cli")

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'engine.setup' has no attribute '{name}'")
    # looked up at each use, not cached here: the source module stays the one place a name is defined
    return getattr(importlib.import_module(_MODULE_OF[name]), _RENAMED.get(name, name))
