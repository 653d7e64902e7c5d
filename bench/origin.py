"""The whole model's decode speed on the machine the project was made for, from a preset's run: the estimate's
roofline for the model there (expert caches under uniform routing) times the decode efficiency the run measured.
Computed, never measured: said so beside the speed the origin measured (engine.tools.presets.FULL_MODEL)."""
from __future__ import annotations

from engine.plan.estimate import Machine

# RTX 5060 8 GB (GDDR7, 448 GB/s), 31 GiB of DDR5-5600 in two channels, PCIe 5 x8, and a Gen5 NVMe at its rated
# read speed (the drive is not named: 14.5 GB/s is what Gen5 drives are rated at)
ORIGIN = Machine("cuda", ram_available_bytes=31 << 30, mem_bw_bps=89.6e9, disk_read_bps=14.5e9,
                 free_disk_bytes=4 << 40, vram_bytes=8 << 30, pcie_bps=31.5e9, gpu_mem_bw_bps=448e9)
ORIGIN_TEXT = "8 GB RTX 5060, 31 GiB RAM, PCIe 5 x8, Gen5 NVMe at 14.5 GB/s"


def origin_projection(result: dict) -> dict | None:
    """For a preset of a model the origin ran (a speed measured there): that model's computed speed there."""
    from engine.plan.estimate import estimate
    from engine.tools.presets import FULL_CONFIG, FULL_MODEL, full_model_config
    preset, reference = result["preset"], FULL_MODEL.get(result["preset"], {}).get("reference_tok_s")
    if preset not in FULL_CONFIG or reference is None:
        return None
    dense_quant = None if result.get("dense_quant", "none") == "none" else result["dense_quant"]
    est = estimate(full_model_config(preset), 0, ORIGIN, result["quant"], dense_quant=dense_quant)
    efficiency = result["decode_efficiency"]
    return {"machine": ORIGIN_TEXT, "quant": result["quant"], "dense_quant": dense_quant or "as stored",
            "verdict": est.verdict, "roofline_tok_s": est.tok_s, "efficiency": efficiency,
            "tok_s": est.tok_s * efficiency, "disk_bytes_per_token": est.disk_bytes_per_token,
            "h2d_bytes_per_token": est.h2d_bytes_per_token, "reference_tok_s": reference, "computed": True}


def origin_lines(result: dict) -> list[str]:
    p = result.get("origin")
    if not p:
        return []
    return [f"computed     {_model_name(result)} on the origin's machine ({p['machine']}), {p['quant']}, dense "
            f"{p['dense_quant']}: {p['tok_s']:.2f} tok/s = its roofline {p['roofline_tok_s']:.2f} tok/s (disk "
            f"{p['disk_bytes_per_token'] / 1e9:.2f} GB, PCIe {p['h2d_bytes_per_token'] / 1e9:.2f} GB a token) x the "
            f"decode efficiency measured here {p['efficiency']:.2f}; measured there: {p['reference_tok_s']} tok/s"]


def _model_name(result: dict) -> str:
    from engine.tools.presets import FULL_MODEL
    return FULL_MODEL[result["preset"]]["name"]
