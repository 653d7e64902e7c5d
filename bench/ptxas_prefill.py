"""Compile the prefill kernels (kernels/moe_prefill.py) for an NVIDIA target on a machine without a GPU, and
print each launch's registers and spill bytes as ptxas reports them: whether a change still compiles for the GPU,
and what its tiles cost, before a GPU session. Needs only the triton wheel (its ptxas).
`python -m bench prefill-kernel --ptxas [--formats nvfp4,mxfp4] [--arch 90]`.
"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import moe_prefill
from kernels.formats import FORMAT_IDS, make_offsets

SHAPE = (1024, 2048)          # olmoe-1b-7b's experts (I, H): the offsets only set constexprs
POINTERS = {"rows_ptr": "*i32", "table_ptr": "*i32", "weight_ptr": "*fp32", "out_ptr": "*fp32",
            "bank_u8": "*u8", "bank_bf16": "*bf16", "bank_f32": "*fp32"}
FIELDS = {"G": "gate", "U": "up", "D": "down"}
PARTS = {"W": "w", "S": "scale", "G": "gscale"}


def _constexprs(fmt: str, config, dtype: torch.dtype) -> dict:
    offsets, _ = make_offsets(fmt, *SHAPE)
    values = {f"{p}{q}": offsets.get(f"{FIELDS[p]}.{PARTS[q]}", 0) for p in FIELDS for q in PARTS}
    return {**values, "FMT": FORMAT_IDS[fmt], "GROUPS": 64, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
            "BLOCK_K": config.block_k, "FP32_DOT": dtype == torch.float32}


def compile_launch(kernel, fmt: str, config, dtype: torch.dtype, arch: int) -> tuple[int, int]:
    """(registers, spill store bytes) of one kernel of moe_prefill in `config`."""
    act = "*fp32" if dtype == torch.float32 else "*bf16"
    params = list(inspect.signature(kernel.fn).parameters)
    consts = {p: v for p, v in _constexprs(fmt, config, dtype).items() if p in params}
    signature = {p: "constexpr" if p in consts else POINTERS.get(p, act if p in ("x_ptr", "h_ptr") else "i32")
                 for p in params}
    src = ASTSource(kernel, signature, constexprs={(params.index(p),): v for p, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": config.num_warps, "num_stages": config.num_stages})
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        Path(ptx).write_text(compiled.asm["ptx"])
        for ptxas in ("ptxas-blackwell", "ptxas"):     # the newer one reads the newer PTX versions Triton writes
            report = subprocess.run([str(bin_dir / ptxas), "-v", f"-arch=sm_{arch}a", ptx, "-o", ptx + ".cubin"],
                                    capture_output=True, text=True).stderr
            if "registers" in report:
                return (int(re.search(r"Used (\d+) registers", report).group(1)),
                        int(re.search(r"(\d+) bytes spill stores", report).group(1)))
    raise RuntimeError(f"ptxas failed: {report[-400:]}")


def report(formats: list[str], arch: int) -> None:
    for fmt in formats:
        for dtype in (torch.bfloat16, torch.float32):
            default = moe_prefill.default_config(dtype)
            for config in dict.fromkeys((default, *(moe_prefill.PrefillConfig(64, 64, 64, w) for w in (4, 8)))):
                gate_up = compile_launch(moe_prefill._gate_up_kernel, fmt, config, dtype, arch)
                down = compile_launch(moe_prefill._down_kernel, fmt, config, dtype, arch)
                print(f"{fmt:6s} x {str(dtype)[6:]:8s} {config}: registers / spill bytes: gate_up {gate_up}, "
                      f"down {down}", flush=True)
