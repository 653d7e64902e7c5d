"""Compile the batch-1 decode kernels (kernels/moe_decode.py; with --dense the int8 dense linear) for an NVIDIA
target on a machine without a GPU, and print each launch's registers and the SASS instructions a weight byte in its
hottest loop: what a change to the tiles costs in issued instructions, before a GPU session. Needs only the triton
wheel (its ptxas and cuobjdump).
`python -m bench kernels --ptxas [--models gpt-oss-120b] [--formats mxfp4,nvfp4] [--arch 90] [--dense]`.
"""
from __future__ import annotations

import inspect
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kernels import moe_decode
from kernels.formats import FORMAT_IDS, make_offsets
from kernels.quant_formats import quant_format
from kernels.tiles import field_offsets

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
POINTERS = {"x_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*bf16", "y_ptr": "*bf16", "h_ptr": "*fp32", "out_ptr": "*fp32", "slot_ptr": "*i32", "base_ptr": "*i32",
            "weight_ptr": "*fp32", "bank_u8": "*u8", "bank_bf16": "*bf16", "bank_f32": "*fp32", "alpha": "fp32",
            "limit": "fp32"}
FIELDS = {"G": "gate", "U": "up", "D": "down"}
PARTS = {"W": "w", "S": "scale", "G": "gscale"}


def _constexprs(fmt: str, inter: int, hidden: int, cfg) -> dict:
    off = field_offsets(make_offsets(fmt, inter, hidden, bias=True)[0])     # gpt-oss's blocks: with biases
    fields = {f"{p}{q}": off[f"{FIELDS[p]}.{PARTS[q]}"] for p in FIELDS for q in PARTS}
    biases = {"GB": off["gate_bias.b"], "UB": off["up_bias.b"], "DB": off["down_bias.b"]}
    return {**fields, **biases, "FMT": FORMAT_IDS[fmt], "ACT": 1, "BLOCK_I": cfg.block_i, "BLOCK_H": cfg.block_h,
            "BLOCK_K": cfg.block_k, "ZERO_OUT": cfg.split_down, "SPLIT": cfg.split_down, "ACCUMULATE": False,
            "BASES": False}


def _sass(kernel, consts: dict, num_warps: int, arch: int) -> tuple[str, str]:
    """(SASS, resource usage) of one launch; ints specialized as multiples of 16, as Triton does at run time."""
    params = list(inspect.signature(kernel.fn).parameters)
    consts = {p: v for p, v in consts.items() if p in params}
    signature = {p: "constexpr" if p in consts else POINTERS.get(p, "i32") for p in params}
    attrs = {(params.index(p),): [["tt.divisibility", 16]] for p in params
             if p in ("H", "I", "block_bytes") or signature[p].startswith("*")}
    src = ASTSource(kernel, signature, constexprs={(params.index(p),): v for p, v in consts.items()}, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        Path(cubin).write_bytes(compiled.asm["cubin"])
        return tuple(subprocess.run([str(BIN / "cuobjdump"), flag, cubin], capture_output=True, text=True,
                                    check=True).stdout for flag in ("-sass", "-res-usage"))


def hottest_loop(sass: str) -> int:
    """Instructions in the longest loop that holds no other loop (a backward branch and its target)."""
    addr = [(int(m.group(1), 16), line) for line in sass.splitlines()
            if (m := re.search(r"/\*([0-9a-f]{4,})\*/\s+\S", line))]
    loops = [(int(m.group(1), 16), at) for at, line in addr
             if (m := re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", line)) and int(m.group(1), 16) < at]
    inner = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    return max((sum(a <= at <= b for at, _ in addr) for a, b in inner), default=0)


def launch_cost(kind: str, fmt: str, inter: int, hidden: int, cfg, arch: int) -> str:
    """'<registers> regs, <instructions a weight byte>' of the gate_up or down launch."""
    kernel = moe_decode._gate_up_kernel if kind == "gate_up" else moe_decode._down_kernel
    sass, usage = _sass(kernel, _constexprs(fmt, inter, hidden, cfg), cfg.num_warps, arch)
    spec = quant_format(fmt)
    per_weight = 2.0 if fmt == "bf16" else 0.5 if spec.is_fp4 else 1.0          # stored bytes a weight, no scales
    rows = 2 * cfg.block_i if kind == "gate_up" else cfg.block_h                  # gate and up share a loop
    per_byte = hottest_loop(sass) * 32 * cfg.num_warps / (rows * cfg.block_k * per_weight)
    registers = re.search(r"REG:(\d+)", usage).group(1)
    return f"{registers} regs, {per_byte:.1f} instructions a weight byte"


def report(models: list[str], formats: list[str], arch: int) -> None:
    from bench.stages.kernels import SHAPES, config_name
    for model in models:
        inter, hidden, _ = SHAPES[model]
        for fmt in formats:
            cfg = moe_decode.default_config(fmt)
            costs = {kind: launch_cost(kind, fmt, inter, hidden, cfg, arch) for kind in ("gate_up", "down")}
            print(f"{model} {fmt} {config_name(cfg)} sm_{arch}: gate_up {costs['gate_up']}; down {costs['down']}",
                  flush=True)


def dense_report(arch: int) -> None:
    """The int8 dense linear's decode launch at each config of the sweep (bench/stages/kernels.py)."""
    from bench.stages.kernels import DENSE_CONFIGS
    from kernels import int8_linear
    for block_n, block_k, num_warps in DENSE_CONFIGS:
        sass, usage = _sass(int8_linear._int8_linear_kernel, {"BLOCK_N": block_n, "BLOCK_K": block_k}, num_warps, arch)
        per_byte = hottest_loop(sass) * 32 * num_warps / (block_n * block_k)
        registers = re.search(r"REG:(\d+)", usage).group(1)
        print(f"int8 dense linear {block_n}/{block_k}/w{num_warps} sm_{arch}: {registers} regs, {per_byte:.1f} "
              "instructions a code byte", flush=True)
