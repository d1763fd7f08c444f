"""Prepared corpora: shards equal the in-memory encoding, memmap reads, samplers and resume."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch

from lamina.data.batches import WindowSampler
from lamina.data.shard_build import prepare_corpus
from lamina.data.shards import ShardSampler, TokenStream, is_prepared, open_prepared
from lamina.data.sources import corpus_files, read_pieces
from lamina.errors import LaminaError


def corpus(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("".join(f"line {i} of a, said she.\n" for i in range(300)))
    (d / "sub" / "b.jsonl").write_text(
        "\n".join(json.dumps({"text": f"doc {i}: é {i * 7}"}) for i in range(40)) + "\n"
    )
    with gzip.open(d / "sub" / "c.txt.gz", "wt") as f:
        f.write("zipped words\n" * 200)
    return d


def documents(d):
    docs, cur = [], []
    for piece, end in read_pieces(corpus_files(d)):
        cur.append(piece)
        if end:
            docs.append("".join(cur))
            cur = []
    return docs


def test_prepared_tokens_equal_the_joined_documents(tmp_path):
    d = corpus(tmp_path)
    s = prepare_corpus(d, "char", tmp_path / "p", shard_tokens=1000)
    p = open_prepared(tmp_path / "p")
    docs = documents(d)
    assert len(docs) == s["documents"] == 42
    want = p.tokenizer.encode_array("\n".join(docs))
    got = np.concatenate([p.train[:], p.val[:]])
    assert np.array_equal(got, want)
    assert len(p.val) == len(want) - int(len(want) * 0.9)
    assert len(s["shards"]) == -(-len(want) // 1000) and p.train.n_shards > 1
    starts = np.load(tmp_path / "p" / "train.docs.npy")
    assert starts[0] == 0 and len(starts) == s["splits"]["train"]["documents"]
    assert is_prepared(tmp_path / "p") and not is_prepared(d)


def test_documents_split_holds_out_whole_documents(tmp_path):
    d = corpus(tmp_path)
    s = prepare_corpus(d, "char", tmp_path / "p", val_by="documents", val_fraction=0.25)
    p = open_prepared(tmp_path / "p")
    n_val = s["splits"]["val"]["documents"]
    assert 0.15 * 42 < n_val < 0.35 * 42
    assert n_val + s["splits"]["train"]["documents"] == 42
    held = p.tokenizer.decode(p.val[:])
    assert "said she" not in held or "doc" not in held  # documents are not cut


def test_shard_sampler_draws_what_window_sampler_draws_and_resumes(tmp_path):
    ids = np.arange(500, dtype=np.uint16) % 97
    maps = [ids[:123], ids[123:300], ids[300:]]
    stream = TokenStream(maps, 10, 480)
    ref = WindowSampler(ids[10:480], 16, seed=3)
    sh = ShardSampler(stream, 16, seed=3)
    for _ in range(3):
        x1, y1 = ref.sample(8)
        x2, y2 = sh.sample(8)
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    state = json.loads(json.dumps(sh.state_dict()))
    assert {"shard", "offset"} <= set(state) and 0 <= state["shard"] < 3
    nxt = sh.sample(4)
    again = ShardSampler(stream, 16, seed=99)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(nxt, again.sample(4), strict=True))


def test_bpe_fit_on_a_bounded_sample(tmp_path):
    d = corpus(tmp_path)
    s = prepare_corpus(d, "bpe:300", tmp_path / "p", fit_bytes=4000)
    p = open_prepared(tmp_path / "p")
    assert p.tokenizer.vocab_size <= 300 and p.train.dtype == np.uint16
    assert s["separator"] == [p.tokenizer.special_tokens["<|endoftext|>"]]
    assert s["tokens"] < s["characters"]


def test_damaged_shards_are_named(tmp_path):
    prepare_corpus(corpus(tmp_path), "char", tmp_path / "p", shard_tokens=1000)
    shard = tmp_path / "p" / "main-00002.bin"
    blob = shard.read_bytes()
    shard.write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    with pytest.raises(LaminaError, match="main-00002.bin fails its CRC32"):
        open_prepared(tmp_path / "p")
    shard.write_bytes(blob[:-5])
    with pytest.raises(LaminaError, match="main-00002.bin has .* bytes"):
        open_prepared(tmp_path / "p")
    shard.unlink()
    with pytest.raises(LaminaError, match="main-00002.bin is missing"):
        open_prepared(tmp_path / "p")


def _rss_file_kb() -> int | None:
    try:
        lines = open("/proc/self/status").read().splitlines()
    except OSError:
        return None
    found = [int(line.split()[1]) for line in lines if line.startswith("RssFile:")]
    return found[0] if found else None


def test_reading_windows_does_not_keep_shard_pages_resident(tmp_path):
    if _rss_file_kb() is None:
        pytest.skip("no RssFile in /proc/self/status")
    ids = np.random.default_rng(0).integers(0, 50, 32 << 20, dtype=np.uint8)
    (tmp_path / "s.bin").write_bytes(ids.tobytes())
    m = np.memmap(tmp_path / "s.bin", dtype=np.uint8, mode="r")
    sampler = ShardSampler(TokenStream([m]), 64, seed=0)
    before = _rss_file_kb()
    for _ in range(50):
        x, _ = sampler.sample(8)
    assert x.shape == (8, 64)
    assert _rss_file_kb() - before < 4096  # 400 windows over 32 MB: pages released each time
