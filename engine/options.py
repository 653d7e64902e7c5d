"""The engine's tunables: one frozen object built at the edge (CLI, app settings, bench, server) and passed down.

Product code reads no environment variable for these; an explicit argument always wins. `eager` turns every fast
path off by construction (no CUDA graphs, no Triton kernel anywhere), so any bug can be bisected against plain
PyTorch.

    opts = Options(eager=True)
    opts = Options.parse(["prefetch_reads=2", "ram_fill=false"])     # the bench's and CLI's `--set KEY=VALUE`
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.errors import SluiceError

CPU_EXPERTS = ("auto", "all", "off")
CPU_KERNELS = ("auto", "fused", "torch")


@dataclass(frozen=True)
class Options:
    eager: bool = False                 # no CUDA graphs and no Triton kernels: the plain torch path everywhere
    cpu_experts: str = "auto"           # RAM-resident experts computed by the CPU: cost model, all of them, none
    cpu_kernel: str = "auto"            # the CPU's int8 experts: fused where faster and matching, always, never
                                        # ("torch": its int8 dense weights too)
    ram_fill: bool = True               # while idle, read the experts no prompt has read yet into free RAM
    prefetch_reads: int | None = None   # next layer's guesses whose disk reads start ahead (None: the default rule)
    prefetch_copies: int | None = None  # next layer's RAM-resident guesses copied ahead (None: the default rule)
    kernel_warmup: bool = True          # a machine's first load checks and compiles kernels in a child process
    # The bench's simulation of a slower PCIe link (e.g. 25: a PCIe 4.0 x16 card): host<->device expert copies
    # paced to this many GB/s, and the placement measures the paced copy. None: this machine's own rate.
    copy_rate_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.cpu_experts not in CPU_EXPERTS:
            raise SluiceError(f"Unknown cpu_experts '{self.cpu_experts}': use one of {', '.join(CPU_EXPERTS)}.")
        if self.cpu_kernel not in CPU_KERNELS:
            raise SluiceError(f"Unknown cpu_kernel '{self.cpu_kernel}': use one of {', '.join(CPU_KERNELS)}.")
        for name in ("prefetch_reads", "prefetch_copies"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SluiceError(f"{name} must be 0 or more, not {value}.")
        if self.copy_rate_gbps is not None and not self.copy_rate_gbps > 0:
            raise SluiceError(f"copy_rate_gbps must be more than 0 GB/s, not {self.copy_rate_gbps}.")

    def replace(self, **changes) -> "Options":
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(cls, assignments: list[str], base: "Options | None" = None) -> "Options":
        """Options from `KEY=VALUE` strings (the bench's and CLI's `--set`), over `base` or the defaults."""
        base = base or cls()
        fields = {f.name: f for f in dataclasses.fields(cls)}
        changes = {}
        for item in assignments:
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in fields:
                raise SluiceError(f"'{item}' is not an option setting: use KEY=VALUE with KEY one of "
                                  f"{', '.join(fields)}.")
            changes[key] = _value(key, raw.strip(), getattr(base, key))
        return dataclasses.replace(base, **changes)


def _value(key: str, raw: str, current):
    lowered = raw.lower()
    if isinstance(current, bool):
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise SluiceError(f"Option {key} takes true or false, not '{raw}'.")
    if key.startswith("prefetch_") or key == "copy_rate_gbps":
        if lowered in ("", "none", "default"):
            return None
        number, kind = (float, "a number") if key == "copy_rate_gbps" else (int, "a whole number")
        try:
            return number(raw)
        except ValueError:
            raise SluiceError(f"Option {key} takes {kind} or 'default', not '{raw}'.") from None
    return raw
