"""Read a Hugging Face snapshot's safetensors shards (with or without an index), validated up front."""
from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import torch
from safetensors import safe_open

from engine.errors import SluiceError

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "U32": 4, "U64": 8}


def read_header(path: Path) -> dict:
    """The safetensors JSON header, after checking the file is long enough to hold every tensor."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SluiceError(f"'{path.name}' is truncated (only {size} bytes); download the model again.")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > min(size - 8, 100_000_000):
            raise SluiceError(f"'{path.name}' is not a valid safetensors file; download the model again.")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SluiceError(f"'{path.name}' has a damaged header; download the model again.") from exc
    if not isinstance(header, dict):
        raise SluiceError(f"'{path.name}' has a damaged header; download the model again.")
    for name, entry in header.items():
        if name != "__metadata__" and not _entry_is_sound(entry):
            raise SluiceError(f"'{path.name}' has a damaged header (tensor '{name}'); download the model again.")
    data_end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + data_end > size:
        raise SluiceError(f"'{path.name}' is truncated ({size} of {8 + header_len + data_end} bytes); "
                          "download the model again.")
    return header


def _entry_is_sound(entry) -> bool:
    """A header entry with a known dtype, a shape of naturals, and offsets spanning exactly its bytes."""
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPE_BYTES:
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        return False
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        return False
    numel = 1
    for n in shape:
        numel *= n
    return offsets[1] - offsets[0] == numel * _DTYPE_BYTES[entry["dtype"]]


class Checkpoint:
    """Tensor name -> shard file, and get(name) -> tensor (as stored)."""

    def __init__(self, model_dir: str | Path):
        self.dir = Path(model_dir)
        index = self.dir / "model.safetensors.index.json"
        has_index = index.is_file()
        if has_index:
            files = sorted(set(_weight_map(index).values()))
        else:
            files = sorted(p.name for p in self.dir.glob("*.safetensors"))
        if not files:
            raise SluiceError(f"No .safetensors weights in '{self.dir}': Sluice reads safetensors checkpoints only.")
        self.headers: dict[str, dict] = {}
        self.file_of: dict[str, str] = {}
        for name in files:
            path = self.dir / name
            if not path.is_file():
                where = "listed in the index" if has_index else "(a broken link or not a file)"
                raise SluiceError(f"The weight file '{name}' {where} is missing; download the model again.")
            self.headers[name] = read_header(path)
            for tensor in self.headers[name]:
                if tensor != "__metadata__":
                    self.file_of[tensor] = name
        self._handles: dict[str, object] = {}
        self.fp8_block = _fp8_block_size(self.dir)

    def names(self) -> list[str]:
        return list(self.file_of)

    def __contains__(self, name: str) -> bool:
        return name in self.file_of

    def nbytes(self, name: str) -> int:
        a, b = self.headers[self.file_of[name]][name]["data_offsets"]
        return b - a

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.headers[self.file_of[name]][name]["shape"])

    def get(self, name: str) -> torch.Tensor:
        if name not in self.file_of:
            raise SluiceError(f"The checkpoint has no tensor '{name}'; it is incomplete or not the model its config says.")
        file = self.file_of[name]
        if file not in self._handles:
            self._handles[file] = safe_open(str(self.dir / file), framework="pt")
        return self._handles[file].get_tensor(name)

    def logical_shape(self, name: str) -> tuple[int, ...]:
        """The weight's shape once dequantised: FP4-packed bytes (int8 with a block scale) hold two values each."""
        shape = self.shape(name)
        dtype = self.headers[self.file_of[name]][name]["dtype"]
        if dtype in ("I8", "U8") and self.scale_of(name) is not None:
            return (*shape[:-1], 2 * shape[-1])
        return shape

    def spelling(self, name: str) -> str:
        """`name` as this checkpoint spells it: DeepSeek-V4 ships its tensors without the `model.` prefix."""
        bare = name.removeprefix("model.")
        return bare if name not in self.file_of and bare in self.file_of else name

    def scale_of(self, name: str) -> str | None:
        """The block-scale tensor of a quantized weight: `X.weight_scale_inv` (DeepSeek-V3 style) or
        `X.scale` (DeepSeek-V4); None for a weight stored as it is."""
        for scale_name in (name + "_scale_inv", name.removesuffix("weight") + "scale" if name.endswith(".weight") else None):
            if scale_name in self.file_of:
                return scale_name
        return None

    def get_float(self, name: str) -> torch.Tensor:
        """The tensor with block-FP8 / FP4 storage undone (float32), or as stored when it is not block-quantized."""
        tensor = self.get(name)
        scale_name = self.scale_of(name)
        if scale_name is None:
            return tensor
        scale = self.get(scale_name)
        if scale.dtype == torch.uint8:                      # ue8m0 scales stored as raw exponent bytes
            scale = torch.exp2(scale.float() - 127.0)
        if tensor.dtype in (torch.int8, torch.uint8):      # FP4 experts: their own [1, 32] grid, not the config's
            return dequantize_fp8_blocks(unpack_fp4(tensor), scale)
        return dequantize_fp8_blocks(tensor, scale, self.fp8_block)

    def mxfp4_parts(self, name: str) -> dict[str, torch.Tensor] | None:
        """An FP4-packed weight (two e2m1 values a byte, low nibble first, one e8m0 scale per 32 values:
        DeepSeek-V4's experts) as the mxfp4 block parts {"w", "scale"} it already is byte for byte, or None."""
        scale_name = self.scale_of(name)
        if scale_name is None:
            return None
        tensor, scale = self.get(name), self.get(scale_name)
        if tensor.dtype not in (torch.int8, torch.uint8) or scale.shape != (tensor.shape[0], 2 * tensor.shape[1] // 32):
            return None
        scale_bytes = scale if scale.dtype == torch.uint8 else scale.view(torch.uint8) \
            if scale.element_size() == 1 else None
        if scale_bytes is None:
            return None
        return {"w": tensor.view(torch.uint8).contiguous(), "scale": scale_bytes.contiguous()}

    def fingerprint(self) -> dict[str, dict]:
        """Per shard: size, modification time and a hash of its header: detects a changed snapshot cheaply."""
        out = {}
        for name, header in self.headers.items():
            digest = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()
            stat = os.stat(self.dir / name)
            out[name] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "header_sha256": digest}
        return out


def _fp8_block_size(model_dir: Path) -> tuple[int, int] | None:
    """quantization_config.weight_block_size of the snapshot's config.json ([128, 128] for DeepSeek-V3), if any."""
    try:
        block = json.loads((model_dir / "config.json").read_text())["quantization_config"]["weight_block_size"]
        return int(block[0]), int(block[1])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def _weight_map(index: Path) -> dict[str, str]:
    """The index's tensor -> shard map, checked: a damaged index is one sentence, not a KeyError."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        raise SluiceError(f"'{index}' is damaged (no readable weight_map); download the model again.") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) and "/" not in v and v.endswith(".safetensors")
                                                   for v in weight_map.values()):
        raise SluiceError(f"'{index}' is damaged (its weight_map does not name .safetensors files); "
                          "download the model again.")
    return weight_map


def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor,
                          block: tuple[int, int] | None = None) -> torch.Tensor:
    """FP8 weight [R, C] with one scale per block (DeepSeek-V3 / Qwen-FP8 style) -> float32.

    The scale grid is [ceil(R/bm), ceil(C/bn)]: edge blocks may be partial (DeepSeek-V3's
    kv_a_proj_with_mqa has 576 rows in 128-row blocks). Without a known block size it is the
    power of two that gives this grid (else an exact division).
    """
    rows, cols = weight.shape
    grid = scale_inv.shape if scale_inv.dim() == 2 else (1, 1)
    sizes = block or tuple(_block_for(n, g) for n, g in zip((rows, cols), grid))
    if any(b is None or -(-n // b) != g for n, g, b in zip((rows, cols), grid, sizes)):
        raise SluiceError(f"An FP8 weight of shape {rows}x{cols} does not match its {grid[0]}x{grid[1]} "
                          "scale blocks; the checkpoint is damaged or of an unknown FP8 layout.")
    scales = scale_inv.float().repeat_interleave(sizes[0], 0)[:rows].repeat_interleave(sizes[1], 1)[:, :cols]
    return weight.float() * scales


def _block_for(n: int, grid: int) -> int | None:
    size = 1 << (-(-n // grid) - 1).bit_length()            # next power of two >= ceil(n / grid)
    if -(-n // size) == grid:
        return size
    return n // grid if n % grid == 0 else None


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """int8 bytes [R, C/2] of two e2m1 values each, the low nibble first (DeepSeek-V4's experts) -> float32 [R, C]."""
    codes = packed.view(torch.uint8).long()
    return torch.stack([_E2M1[codes & 0xF], _E2M1[codes >> 4]], dim=-1).reshape(packed.shape[0], -1)
