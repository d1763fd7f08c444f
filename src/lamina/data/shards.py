"""Prepared corpora: token shards on disk with a JSON index, read back through memory maps.

A prepared folder (written by `lamina.data.shard_build.prepare_corpus`):

    DIR/index.json           what is here (INDEX_NAME; its presence marks a prepared folder)
    DIR/tokenizer.json       the tokenizer the ids belong to
    DIR/<stream>-NNNNN.bin   raw little-endian ids in `dtype` (uint8/16/32 from the vocabulary)
    DIR/<split>.docs.npy     int64 start offset of every document within its split

index.json holds: format/version, tokenizer spec and vocab_size, dtype, the separator ids put
between documents, every shard (file, stream, tokens, bytes, crc32), the splits (each a token
range [start, stop) of one stream, with its document count), how validation was chosen
({"by": "tail" | "documents", "fraction": f}), counts (documents, characters, tokens, bad lines
skipped), a fingerprint of the corpus text and the sha256 of the tokenizer (`tokenizer_hash`),
checked on open: a tokenizer.json swapped for another of the same size is refused.

    is_prepared(path) -> bool                 a folder holding index.json
    read_index(dir) -> dict                   parsed and checked
    verify_shards(dir, index, checksums=True) every shard present with its recorded size (and
                                              CRC32); the first bad one is named
    open_prepared(dir) -> Prepared            (train, val) TokenStreams, tokenizer, fingerprint
    TokenStream(maps, start, stop)            the ids [start, stop) of shards laid end to end:
                                              len(), [i:j] -> ndarray, gather(idx) (any shape)
    ShardWriter(dir, stream, dtype, shard_tokens)   appends ids to <stream>-NNNNN.bin files
    ShardSampler(stream, block_size, seed)    WindowSampler's interface and draws over a stream
    sampler_for(tokens, ...) / eval_batches_for(tokens, ...)   either kind of split

Each shard is opened once with `np.memmap` (read-only); after each gather the pages it mapped
are released (`release`), so resident memory stays at about one batch's pages whatever the
corpus size and however long the run. A ShardSampler draws exactly the starts a
WindowSampler with the same seed draws over the same ids, and its state names the shard and
offset of the last window drawn, with the generator state that makes a resume exact.

Deliberately unaware of how shards are written from text (`shard_build`), of models and training.
"""

from __future__ import annotations

import mmap
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from lamina.data.batches import WindowSampler, check_int, fixed_batches
from lamina.errors import LaminaError
from lamina.files import read_json
from lamina.schema import Arr, FileName, Int, Obj, OneOf, Str, check
from lamina.tokenizers.kinds import Tokenizer, load_tokenizer, tokenizer_hash

INDEX_NAME = "index.json"
FORMAT = "lamina-prepared"
VERSION = 1
_CRC_CHUNK = 1 << 22


class ShardWriter:
    """Appends ids to `<stream>-NNNNN.bin` files of at most `shard_tokens` ids each."""

    def __init__(self, directory: Path, stream: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.dir, self.stream, self.dtype, self.limit = directory, stream, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.total = 0
        self._f: BinaryIO | None = None

    def _open(self) -> None:
        name = f"{self.stream}-{len(self.shards):05d}.bin"
        self._f = open(self.dir / name, "wb")  # noqa: SIM115 - closed in _close
        self.shards.append(
            {"file": name, "stream": self.stream, "tokens": 0, "bytes": 0, "crc32": 0}
        )

    def write(self, ids: np.ndarray) -> None:
        ids = ids.astype(self.dtype.newbyteorder("<"), copy=False)
        while len(ids):
            if self._f is None or self.shards[-1]["tokens"] >= self.limit:
                self.close()
                self._open()
            cur = self.shards[-1]
            part, ids = ids[: self.limit - cur["tokens"]], ids[self.limit - cur["tokens"] :]
            blob = part.tobytes()
            self._f.write(blob)
            cur["tokens"] += len(part)
            cur["bytes"] += len(blob)
            cur["crc32"] = zlib.crc32(blob, cur["crc32"])
            self.total += len(part)

    def close(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self._f = None


def is_prepared(path: str | os.PathLike[str] | None) -> bool:
    """Whether `path` is a folder written by `lamina prepare` (it holds index.json)."""
    return path is not None and (Path(path) / INDEX_NAME).is_file()


SHARD = Obj(
    {
        "file": FileName(),
        "stream": Str(nonempty=True),
        "tokens": Int(0),
        "bytes": Int(0),
        "crc32": Int(0, 2**32 - 1),
    }
)
SPLIT = Obj({"stream": Str(nonempty=True), "start": Int(0), "stop": Int(0)})
INDEX = Obj(
    {
        "format": OneOf(FORMAT),
        "version": Int(1),
        "dtype": OneOf("uint8", "uint16", "uint32"),
        "vocab_size": Int(1, 2**32),
        "shards": Arr(SHARD),
        "splits": Obj({"train": SPLIT, "val": SPLIT}),
        "spec": Str(),
        "fingerprint": Str(),
        "tokens": Int(0),
    },
    optional={"tokenizer_sha256": Str(), "separator": Arr(Int(0))},
)


def read_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """index.json of a prepared folder, read through its schema (`INDEX`) and checked: each
    shard's bytes agree with its tokens, each split lies inside its stream."""
    d = Path(directory)
    where = d / INDEX_NAME
    index = read_json(where)
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise LaminaError(f"{where} is not a lamina prepared-corpus index")
    if isinstance(index.get("version"), int) and index["version"] > VERSION:
        raise LaminaError(f"{where} has version {index['version']}; this lamina reads {VERSION}")
    index = check(INDEX, index, str(where))
    size = np.dtype(index["dtype"]).itemsize
    totals: dict[str, int] = {}
    for i, shard in enumerate(index["shards"]):
        if shard["bytes"] != shard["tokens"] * size:
            raise LaminaError(
                f"{where}: shards[{i}] has {shard['tokens']} tokens of {index['dtype']} but "
                f"{shard['bytes']} bytes"
            )
        totals[shard["stream"]] = totals.get(shard["stream"], 0) + shard["tokens"]
    for name, sp in index["splits"].items():
        total = totals.get(sp["stream"], 0)
        if not sp["start"] <= sp["stop"] <= total:
            raise LaminaError(
                f"{where}: split {name} [{sp['start']}, {sp['stop']}) is outside its stream "
                f"{sp['stream']!r} of {total} tokens"
            )
    return index


def file_crc32(path: Path) -> int:
    """CRC32 of a file, read in 4 MiB pieces (plain reads: nothing stays resident)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def verify_shards(
    directory: str | os.PathLike[str], index: dict[str, Any], checksums: bool = True
) -> None:
    """Every shard present, of its recorded size and (with `checksums`) CRC32; else name it."""
    d = Path(directory)
    for shard in index["shards"]:
        p = d / shard["file"]
        if not p.is_file():
            raise LaminaError(
                f"prepared data {d}: shard {shard['file']} is missing; run `lamina prepare` again"
            )
        size = p.stat().st_size
        if size != shard["bytes"]:
            raise LaminaError(
                f"prepared data {d}: shard {shard['file']} has {size} bytes, the index says "
                f"{shard['bytes']} (truncated or changed); run `lamina prepare` again"
            )
        if checksums and file_crc32(p) != shard["crc32"]:
            raise LaminaError(
                f"prepared data {d}: shard {shard['file']} fails its CRC32 check (changed after "
                "preparation); run `lamina prepare` again"
            )


class TokenStream:
    """Ids [start, stop) of several shards laid end to end, each an np.memmap opened once."""

    def __init__(self, maps: list[np.ndarray], start: int = 0, stop: int | None = None) -> None:
        self._maps = maps
        sizes = np.array([len(m) for m in maps], dtype=np.int64)
        self._bounds = np.concatenate([[0], np.cumsum(sizes)])  # shard k: [b[k], b[k+1])
        total = int(self._bounds[-1])
        self._start, self._stop = start, total if stop is None else stop
        if not 0 <= self._start <= self._stop <= total:
            raise LaminaError(f"token range [{start}, {stop}) is outside 0..{total}")
        self.dtype = maps[0].dtype if maps else np.dtype(np.uint32)
        self.ndim = 1

    def __len__(self) -> int:
        return self._stop - self._start

    @property
    def n_shards(self) -> int:
        return len(self._maps)

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, offset inside it) of token i of this stream."""
        g = self._start + int(i)
        k = int(np.searchsorted(self._bounds, g, side="right")) - 1
        return k, g - int(self._bounds[k])

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise LaminaError("a TokenStream is read by contiguous slices or gather()")
        a, b, _ = key.indices(len(self))
        a, b = self._start + a, self._start + max(a, b)
        parts = []
        for k in range(len(self._maps)):
            lo, hi = int(self._bounds[k]), int(self._bounds[k + 1])
            if hi <= a or lo >= b:
                continue
            parts.append(np.asarray(self._maps[k][max(a, lo) - lo : min(b, hi) - lo]))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def gather(self, idx: np.ndarray) -> np.ndarray:
        """Ids at positions `idx` (int64, any shape) of this stream."""
        g = np.asarray(idx, dtype=np.int64) + self._start
        flat = g.ravel()
        shard = np.searchsorted(self._bounds, flat, side="right") - 1
        out = np.empty(flat.shape, dtype=self.dtype)
        for k in np.unique(shard):
            sel = shard == k
            out[sel] = self._maps[k][flat[sel] - self._bounds[k]]
            release(self._maps[k])
        return out.reshape(g.shape)


class ShardSampler(WindowSampler):
    """WindowSampler over a TokenStream: the same starts for the same seed, read shard-wise."""

    def __init__(self, tokens: TokenStream, block_size: int, seed: int = 0) -> None:
        self._block_size = check_int(block_size, "block_size", 1)
        self._seed = check_int(seed, "seed", 0)
        if len(tokens) < self._block_size + 1:
            raise LaminaError(
                f"the split has {len(tokens)} tokens, but block_size={self._block_size} needs "
                f"at least {self._block_size + 1} (block_size + 1); use a smaller block_size "
                "or more data"
            )
        self._tokens = tokens
        self._rng = np.random.Generator(np.random.PCG64(self._seed))
        self._batches_drawn = 0
        self._offsets = np.arange(self._block_size + 1, dtype=np.int64)
        self._last = (0, 0)

    def starts(self, batch_size: int) -> np.ndarray:
        out = super().starts(batch_size)
        self._last = self._tokens.locate(int(out[-1]))
        return out

    def windows(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        s = np.asarray(starts).astype(np.int64, copy=False)
        high = len(self._tokens) - self._block_size - 1
        if s.ndim != 1 or s.size == 0 or (s < 0).any() or (s > high).any():
            raise LaminaError(f"window starts must be a non-empty 1-D array in [0, {high}]")
        ids = self._tokens.gather(s[:, None] + self._offsets[None, :])
        buf = torch.from_numpy(ids.astype(np.int64))
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        shard, offset = self._last
        return {**super().state_dict(), "shard": shard, "offset": offset}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self._last = (int(d.get("shard", 0)), int(d.get("offset", 0)))


def sampler_for(tokens: Any, block_size: int, seed: int = 0) -> WindowSampler:
    """A WindowSampler for an in-memory array, a ShardSampler for a TokenStream."""
    if isinstance(tokens, TokenStream):
        return ShardSampler(tokens, block_size, seed=seed)
    return WindowSampler(tokens, block_size, seed=seed)


def eval_batches_for(
    tokens: Any, block_size: int, batch_size: int, n_batches: int, seed: int = 1234
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`fixed_batches` for either kind of split."""
    if not isinstance(tokens, TokenStream):
        return fixed_batches(tokens, block_size, batch_size, n_batches, seed=seed)
    sampler = ShardSampler(tokens, block_size, seed=seed)
    return [sampler.sample(batch_size) for _ in range(check_int(n_batches, "n_batches", 1))]


def release(m: np.ndarray) -> None:
    """Unmap the pages of a read-only shard map from this process (they stay in the page cache).

    Reading a few random windows mapped about 2 MB of file pages each into the process here
    (the page cache holds large folios, mapped whole; MADV_RANDOM did not help), so resident
    memory grew with every batch toward the corpus size. MADV_DONTNEED after each gather keeps
    it at one batch's pages, at a small cost (BENCHMARKS.md, Preparing large corpora)."""
    raw = getattr(m, "_mmap", None)
    if raw is not None and hasattr(raw, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        raw.madvise(mmap.MADV_DONTNEED)


@dataclass
class Prepared:
    """An opened prepared folder."""

    path: Path
    index: dict[str, Any]
    tokenizer: Tokenizer
    train: TokenStream
    val: TokenStream

    @property
    def fingerprint(self) -> str:
        """Changes when the corpus, the tokenizer or the split does."""
        return f"prepared:{self.index['fingerprint']}:{self.index['tokens']}:{self.index['spec']}"


def open_prepared(directory: str | os.PathLike[str], checksums: bool = True) -> Prepared:
    """Check the shards against the index, then memory-map each one once."""
    d = Path(directory)
    index = read_index(d)
    verify_shards(d, index, checksums)
    tokenizer = load_tokenizer(d / "tokenizer.json")
    if int(tokenizer.vocab_size) != int(index["vocab_size"]):
        raise LaminaError(f"{d / 'tokenizer.json'} does not match the index's vocabulary size")
    recorded = index.get("tokenizer_sha256")  # absent in folders of an older lamina
    if recorded is not None and recorded != tokenizer_hash(tokenizer):
        raise LaminaError(
            f"{d / 'tokenizer.json'} is not the tokenizer these shards were written with "
            "(its hash differs from index.json's); run `lamina prepare` again"
        )
    dtype = np.dtype(index["dtype"]).newbyteorder("<")
    streams: dict[str, list[np.ndarray]] = {}
    for shard in index["shards"]:
        if shard["tokens"] == 0:
            continue
        m = np.memmap(d / shard["file"], dtype=dtype, mode="r", shape=(shard["tokens"],))
        streams.setdefault(shard["stream"], []).append(m)
    splits = {}
    for name in ("train", "val"):
        sp = index["splits"].get(name)
        if sp is None:
            raise LaminaError(f"{d / INDEX_NAME} has no {name!r} split")
        splits[name] = TokenStream(streams.get(sp["stream"], []), sp["start"], sp["stop"])
    return Prepared(d, index, tokenizer, splits["train"], splits["val"])
