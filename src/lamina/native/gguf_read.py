"""GGUF files read safely: metadata into plain Python, tensors as memory-mapped quantized blocks.

    read_gguf(path) -> GGUFContents
        .metadata  dict[str, Any]      strings decoded, arrays as lists, numbers as int/float/bool
        .tensors   dict[str, GGUFTensor]    in file order
    GGUFTensor: name, qtype ("Q4_1", "F32", ...), shape (torch order: rows first), raw (numpy
        view into the memory map: uint8 blocks of shape (rows..., bytes per row) for quantized
        types, float16/float32 for F16/F32), .nbytes; .values() -> fp32 numpy array of
        `shape`; .dequantize() -> the same as an fp32 torch.Tensor (the one use of torch here,
        imported when called: the torch-free runtime (runtime.py) reads files with this too)

The header (key/values and tensor infos) is parsed here, not by `gguf.GGUFReader`: the reader
trusts the counts it finds (a corrupt array length makes it loop without end) and turns a
vocabulary into one numpy array per token (about 3 s for SmolLM2's). Every read here checks the
bytes are there first, so a truncated or corrupt file is refused with one LaminaError line and
nothing past its end is read. Tensor data must lie, aligned, inside the file. The numbers
(value types, block sizes) and the dequantizers come from the `gguf` package.

Dequantization covers F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the K-quants Q2_K, Q3_K,
Q4_K, Q5_K, Q6_K and Q8_K, and IQ4_NL and IQ4_XS, each exactly as gguf-py's `gguf.quants`
dequantizes it (Q8_K, which gguf-py lacks, is d * q: an fp32 d and 256 int8 q per block, as
ggml's dequantize_row_q8_K); other types are listed (their blocks can be read raw) but refused
by `dequantize`, naming the type.
Big-endian files and GGUF versions other than 2 and 3 are refused. Deliberately unaware of
models and of what the tensors mean.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lamina.errors import LaminaError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEQUANTIZABLE = (
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS",
)  # fmt: skip
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 8  # metadata arrays inside arrays (real files nest at most 2 deep)
# GGUF value types -> struct format (strings 8 and arrays 9 are handled apart)
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_NUMPY = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "u1",
          10: "<u8", 11: "<i8", 12: "<f8"}  # fmt: skip
STRING, ARRAY = 8, 9


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file named *.gguf or beginning with GGUF's magic bytes."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() == ".gguf":
        return True
    try:
        with p.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise LaminaError("reading GGUF needs the `gguf` package: pip install gguf") from None
    return gguf


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: its blocks as they lie in the file (a read-only view)."""

    name: str
    qtype: str  # GGML type name: "F32", "Q4_1", ...
    shape: tuple[int, ...]  # torch order (GGUF lists dims innermost first; this is reversed)
    raw: np.ndarray = field(repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def dequantize(self) -> Any:
        """The tensor in fp32 (a new CPU torch.Tensor of `shape`); see `values`."""
        import torch  # the torch side of this reader (its callers all run torch)

        return torch.from_numpy(self.values())

    def values(self) -> np.ndarray:
        """The tensor in fp32 (a new array of `shape`); refuses types lamina cannot read."""
        if self.qtype not in DEQUANTIZABLE:
            raise LaminaError(
                f"GGUF tensor {self.name} has type {self.qtype}, which lamina cannot read "
                f"(it reads {', '.join(DEQUANTIZABLE)})"
            )
        gguf = _gguf()
        if self.qtype in ("F32", "F16"):
            values = self.raw.astype(np.float32)  # a copy: never a view of the map
        elif self.qtype == "Q8_K":
            values = _q8_k(self.raw)
        else:
            with np.errstate(all="ignore"):  # a damaged scale: check_finite names the tensor
                values = gguf.quants.dequantize(self.raw, gguf.GGMLQuantizationType[self.qtype])
        return np.ascontiguousarray(values, dtype=np.float32).reshape(self.shape)


def _q8_k(raw: np.ndarray) -> np.ndarray:
    """Q8_K blocks (fp32 d, 256 int8 q, 16 int16 sums of 16) -> fp32 d * q, block by block."""
    blocks = np.ascontiguousarray(raw).reshape(-1, 292)
    d = blocks[:, :4].copy().view(np.float32)
    return (d * blocks[:, 4:260].view(np.int8).astype(np.float32)).reshape(-1)


@dataclass(frozen=True)
class GGUFContents:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensor]
    alignment: int
    data_offset: int  # where the tensor data starts
    file_map: Any = field(default=None, repr=False)  # the mmap the tensors view

    def drop_pages(self, part: np.ndarray | None = None) -> None:
        """Hand the file's pages read so far back to the kernel (they stop counting in this
        process's memory; a view read again pages them back in from the file): all of them, or
        those under `part` (a view into the map, e.g. a tensor's `raw`, once converted)."""
        madvise = getattr(self.file_map, "madvise", None)
        if madvise is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        if part is None:
            madvise(mmap.MADV_DONTNEED)
            return
        base = np.frombuffer(self.file_map, np.uint8).ctypes.data
        start = part.ctypes.data - base
        if not 0 <= start <= start + part.nbytes <= len(self.file_map):
            raise LaminaError("drop_pages: the array is not a view into this file's map")
        first = start - start % mmap.PAGESIZE
        madvise(mmap.MADV_DONTNEED, first, start + part.nbytes - first)


def shown(name: str, limit: int = 60) -> str:
    """A name from the file, safe to print on one line (a corrupt one can be anything)."""
    if name.isprintable() and len(name) <= limit:
        return name
    return repr(name[:limit]) + ("..." if len(name) > limit else "")


class _Cursor:
    """Reads little-endian values from a buffer, refusing any read past its end."""

    def __init__(self, buf: np.ndarray, where: str) -> None:
        self.buf, self.pos, self.size, self.where = buf, 0, int(buf.size), where

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise LaminaError(
                f"{self.where} is truncated or corrupt: {what} needs {n:,} bytes at offset "
                f"{self.pos:,}, the file has {self.size:,}"
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        self.need(n, what)
        data = self.buf[self.pos : self.pos + n].tobytes()
        self.pos += n
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise LaminaError(
                f"{self.where}: {what} is not valid UTF-8 (a corrupt file?)"
            ) from None

    def value(self, vtype: int, what: str) -> Any:
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            return self.array(what)
        if vtype not in _SCALARS:
            raise LaminaError(f"{self.where}: {what} has unknown value type {vtype} (corrupt?)")
        return self.scalar(_SCALARS[vtype], what)

    def array(self, what: str, depth: int = 1) -> list[Any]:
        if depth > MAX_ARRAY_DEPTH:
            raise LaminaError(
                f"{self.where}: {what} nests arrays deeper than {MAX_ARRAY_DEPTH} (corrupt?)"
            )
        etype = self.scalar("I", what)
        count = self.scalar("Q", what)
        if etype in _NUMPY:  # numbers: one bounded numpy read
            dtype = np.dtype(_NUMPY[etype])
            self.need(count * dtype.itemsize, what)
            end = self.pos + count * dtype.itemsize
            values = self.buf[self.pos : end].view(dtype)
            self.pos = end
            return values.astype(bool).tolist() if etype == 7 else values.tolist()
        if etype == STRING:
            self.need(count * 8, what)  # each string is at least its 8-byte length
            return [self.string(what) for _ in range(count)]
        if etype == ARRAY:
            self.need(count * 12, what)
            return [self.array(what, depth + 1) for _ in range(count)]
        raise LaminaError(f"{self.where}: {what} is an array of unknown type {etype} (corrupt?)")


def _header(cur: _Cursor) -> tuple[int, int, int]:
    if cur.size < 4:
        raise LaminaError(f"{cur.where} is not a GGUF file ({cur.size} bytes, no magic)")
    magic = cur.buf[:4].tobytes()
    if magic != MAGIC:
        raise LaminaError(f"{cur.where} is not a GGUF file (it starts {magic!r}, not b'GGUF')")
    cur.pos = 4
    version = cur.scalar("I", "the version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in VERSIONS:
            raise LaminaError(f"{cur.where} is a big-endian GGUF; lamina reads little-endian ones")
        raise LaminaError(f"{cur.where}: GGUF version {version}, lamina reads versions 2 and 3")
    n_tensors = cur.scalar("Q", "the tensor count")
    n_kv = cur.scalar("Q", "the metadata count")
    # every key/value takes >= 13 bytes and every tensor info >= 24: counts beyond the file
    # are corrupt, not just large
    cur.need(n_kv * 13 + n_tensors * 24, "the metadata and tensor infos")
    return version, n_tensors, n_kv


def _tensor_infos(cur: _Cursor, count: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    infos = []
    for i in range(count):
        name = cur.string(f"tensor info {i}")
        label = shown(name)
        n_dims = cur.scalar("I", f"tensor {label}'s dimension count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise LaminaError(f"{cur.where}: tensor {label} has {n_dims} dimensions (corrupt?)")
        dims = tuple(cur.scalar("Q", f"tensor {label}'s shape") for _ in range(n_dims))
        qtype = cur.scalar("I", f"tensor {label}'s type")
        offset = cur.scalar("Q", f"tensor {label}'s offset")
        infos.append((name, dims, qtype, offset))
    return infos


def _tensor(
    name: str, dims: tuple[int, ...], raw_type: int, offset: int, buf: np.ndarray, where: str
) -> GGUFTensor:
    gguf = _gguf()
    try:
        qtype = gguf.GGMLQuantizationType(raw_type)
    except ValueError:
        raise LaminaError(
            f"{where}: tensor {shown(name)} has unknown GGML type {raw_type}"
        ) from None
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    if any(d <= 0 for d in dims) or dims[0] % block:
        raise LaminaError(
            f"{where}: tensor {shown(name)} has shape {list(dims)}, which {qtype.name} blocks of "
            f"{block} cannot tile (corrupt?)"
        )
    n = int(np.prod(dims, dtype=object))
    nbytes = n // block * type_size
    if offset + nbytes > buf.size:
        raise LaminaError(
            f"{where} is truncated or corrupt: tensor {shown(name)} needs bytes up to "
            f"{offset + nbytes:,}, the file has {buf.size:,}"
        )
    shape = tuple(reversed(dims))
    data = buf[offset : offset + nbytes]
    if qtype.name in ("F32", "F16"):
        raw = data.view(np.float32 if qtype.name == "F32" else np.float16).reshape(shape)
    else:
        raw = data.reshape(*shape[:-1], shape[-1] // block * type_size)
    return GGUFTensor(name, qtype.name, shape, raw)


def read_gguf(path: str | os.PathLike[str]) -> GGUFContents:
    """Parse a GGUF file's header and map its tensors (nothing is dequantized here)."""
    p = Path(path)
    if not p.is_file():
        raise LaminaError(f"no such GGUF file: {p}")
    where = str(p)
    if p.stat().st_size == 0:
        raise LaminaError(f"{where} is empty, not a GGUF file")
    # a plain ndarray view of the map (memmap's own slicing is slow, paid on every slice)
    mapped = np.memmap(p, dtype=np.uint8, mode="r")
    buf = mapped.view(np.ndarray)
    cur = _Cursor(buf, where)
    version, n_tensors, n_kv = _header(cur)
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key {i}")
        vtype = cur.scalar("I", f"metadata {shown(key)}'s type")
        if key in metadata:
            raise LaminaError(f"{where}: metadata key {shown(key)} appears twice (corrupt?)")
        metadata[key] = cur.value(vtype, f"metadata {shown(key)}")
    infos = _tensor_infos(cur, n_tensors)
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise LaminaError(f"{where}: general.alignment {alignment!r} is not a power of two")
    start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for name, dims, raw_type, offset in infos:
        if name in tensors:
            raise LaminaError(f"{where}: tensor {shown(name)} appears twice (corrupt?)")
        if offset % alignment:
            raise LaminaError(f"{where}: tensor {shown(name)}'s offset {offset} is not aligned")
        tensors[name] = _tensor(name, dims, raw_type, start + offset, buf, where)
    return GGUFContents(
        p, version, metadata, tensors, alignment, start, getattr(mapped, "_mmap", None)
    )
