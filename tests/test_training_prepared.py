"""Training and evaluating on a prepared folder: same batches as raw text, exact resume, eval."""

from __future__ import annotations

import json

import torch

from lamina.cli import main
from lamina.data.shard_build import prepare_corpus
from lamina.data.shards import ShardSampler
from lamina.training.config import TrainConfig
from lamina.training.session import new_session, resume_session, save_checkpoint

TEXT = "".join(f"Line {i}: the quick brown fox jumps over {i % 7} lazy dogs.\n" for i in range(400))


def tiny(data, **kw) -> TrainConfig:
    base = dict(data=str(data), preset="tiny", batch_size=4, max_steps=3, eval_batches=2,
                device="cpu", model_overrides={"block_size": 16})  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_prepared_folder_trains_on_the_batches_raw_text_gives(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    prepare_corpus(tmp_path / "a.txt", "char", tmp_path / "p", shard_tokens=3000)
    raw = new_session(tiny(tmp_path / "a.txt"), out=None)
    prep = new_session(tiny(tmp_path / "p"), out=None)
    assert isinstance(prep.objective.sampler, ShardSampler)
    assert prep.objective.train.n_shards > 1
    for _ in range(2):
        assert all(
            torch.equal(a, b)
            for a, b in zip(raw.objective.draw(4), prep.objective.draw(4), strict=True)
        )
    assert torch.equal(raw.objective.eval_batches()[0][0], prep.objective.eval_batches()[0][0])


def test_resume_on_prepared_data_is_exact(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    prepare_corpus(tmp_path / "a.txt", "char", tmp_path / "p", shard_tokens=3000)
    s = new_session(tiny(tmp_path / "p"), out=tmp_path / "r")
    s.objective.draw(4)
    save_checkpoint(s)
    state = json.loads((tmp_path / "r" / "trainer_state.json").read_text())
    assert {"shard", "offset"} <= set(state["task"]["sampler"])
    nxt = s.objective.draw(4)
    back = resume_session(tmp_path / "r", {})
    assert torch.equal(back.objective.draw(4)[0], nxt[0])


def test_cli_trains_and_evaluates_on_prepared_data(tmp_path, capsys):
    (tmp_path / "a.txt").write_text(TEXT)
    assert main(["prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "p"), "--quiet"]) == 0
    args = ["train", "--data", str(tmp_path / "p"), "--preset", "tiny", "--block-size", "16",
            "--max-steps", "2", "--batch-size", "4", "--eval-batches", "1", "--quiet",
            "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args[:-1], str(tmp_path / "r3"), "--tokenizer", "byte"]) == 2
    assert "--tokenizer byte disagrees with --data" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "r"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == len(TEXT) - int(len(TEXT) * 0.9) - 1
    assert "loss_per_char" not in got  # the index records no validation characters
    assert main(["eval", str(tmp_path / "r")]) == 0
    assert "per token only" in capsys.readouterr().out
    (tmp_path / "p" / "main-00000.bin").write_bytes(b"\x00" * 10)
    assert main([*args[:-1], str(tmp_path / "r2")]) == 2
    assert "main-00000.bin has 10 bytes" in capsys.readouterr().err
