"""Safetensors files read tensor by tensor, each straight into the memory it will live in.

    f = TensorFile(path)           the header only: names, dtypes, shapes, byte ranges (checked)
    f.names, f.shape(name), f.dtype(name)
    f.read(name, out=None) -> Tensor     one tensor read with readinto, into `out` if given (a
                                         contiguous tensor of that shape, e.g. a slice of a fused
                                         weight), else into a new tensor; `dtype=` casts it
    read_tensors(path) -> dict[str, Tensor]              every tensor of the file

Why not `safetensors.torch.load_file`: that maps the whole file and hands out views of it, so a
tensor that must be fused, transposed or cast costs its mapped pages plus the copy. Reading each
tensor into its final place keeps a model's resident memory at its weight bytes plus one
tensor, and the page cache (which is not the process's memory) holds the file.

The header is checked before any data is read: its length against the file's, each entry's
dtype, shape and byte range (inside the data, of exactly shape x itemsize bytes); a file cut
short is refused when read, never read past its end. Every refusal is a `LaminaError` naming the
file. Deliberately unaware of models: tensors in, tensors out.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
from torch import Tensor

from lamina.errors import LaminaError

DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
MAX_HEADER = 100 * 2**20  # safetensors' own limit


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


class TensorFile:
    """The checked header of one safetensors file; `read` fetches tensors one at a time."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = p = Path(path)
        if not p.is_file():
            raise LaminaError(f"missing file: {p}")
        try:
            size = p.stat().st_size
            with p.open("rb") as f:
                head = f.read(8)
                n = int.from_bytes(head, "little") if len(head) == 8 else -1
                if not 2 <= n <= min(MAX_HEADER, size - 8):
                    raise LaminaError(f"{p} is not a readable safetensors file (bad header size)")
                header = json.loads(f.read(n).decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # nested deep
            raise LaminaError(f"{p} is not a readable safetensors file ({e})") from None
        if not isinstance(header, dict):
            raise LaminaError(f"{p} is not a readable safetensors file (header is not an object)")
        meta = header.pop("__metadata__", None) or {}
        self.metadata: dict[str, str] = meta if isinstance(meta, dict) else {}
        self.start = 8 + n
        self.entries: dict[str, tuple[torch.dtype, tuple[int, ...], int, int]] = {}
        for name, entry in header.items():
            self.entries[name] = self._entry(name, entry, size - self.start)

    def _entry(
        self, name: str, e: object, data: int
    ) -> tuple[torch.dtype, tuple[int, ...], int, int]:
        bad = f"{self.path} is not a readable safetensors file (tensor {name!r}"
        if not isinstance(e, dict) or e.get("dtype") not in DTYPES:
            got = e.get("dtype") if isinstance(e, dict) else e
            raise LaminaError(f"{bad} has dtype {got!r}; lamina reads {', '.join(DTYPES)})")
        shape, offsets = e.get("shape"), e.get("data_offsets")
        lists = isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
        numbers = [*shape, *offsets] if lists else []
        if not lists or not all(_count(x) for x in numbers):
            raise LaminaError(f"{bad} has no valid shape and data_offsets)")
        dtype = DTYPES[e["dtype"]]
        begin, end = offsets
        want = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if end - begin != want or end > data:
            raise LaminaError(
                f"{bad} spans bytes {begin}..{end} of {data}; its shape {shape} needs {want})"
            )
        return dtype, tuple(shape), begin, end

    @property
    def names(self) -> list[str]:
        return list(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name][1]

    def dtype(self, name: str) -> torch.dtype:
        return self.entries[name][0]

    def nbytes(self) -> int:
        return sum(end - begin for _, _, begin, end in self.entries.values())

    def read(
        self, name: str, out: Tensor | None = None, dtype: torch.dtype | None = None
    ) -> Tensor:
        """Tensor `name`, read into `out` (any dtype: cast on the way) or a new tensor."""
        stored, shape, begin, end = self.entries[name]
        target = (
            stored if out is None and dtype is None else (out.dtype if out is not None else dtype)
        )
        if out is not None and tuple(out.shape) != shape:
            raise LaminaError(f"{self.path}: tensor {name} is {shape}, not {tuple(out.shape)}")
        direct = (
            out is not None
            and out.dtype == stored
            and out.is_contiguous()
            and out.device.type == "cpu"
        )
        buf = out if direct else torch.empty(shape, dtype=stored)
        if end > begin:
            view = buf.reshape(-1).view(torch.uint8).numpy()
            try:
                with self.path.open("rb") as f:
                    f.seek(self.start + begin)
                    got = f.readinto(view)
            except OSError as e:
                raise LaminaError(f"cannot read {self.path} ({e.strerror or e})") from None
            if got != end - begin:
                raise LaminaError(f"{self.path} is truncated: tensor {name} is cut short")
        if direct:
            return out
        if out is not None:
            return out.copy_(buf)
        return buf if target == stored else buf.to(target)


def read_tensors(
    path: str | os.PathLike[str], dtype: torch.dtype | None = None
) -> dict[str, Tensor]:
    """Every tensor of a safetensors file (floating ones cast to `dtype` when given)."""
    f = TensorFile(path)
    out = {}
    for name in f.names:
        cast = dtype if dtype is not None and f.dtype(name).is_floating_point else None
        out[name] = f.read(name, dtype=cast)
    return out
