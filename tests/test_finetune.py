"""`lamina train --init-from SOURCE`: the weights really load, the fine-tune moves them and
lowers the loss; converted GPT-2 and lamina runs both work; bad sources are one line, exit 2."""

from __future__ import annotations

import json

import pytest
import torch

import lamina
from lamina.cli import main
from lamina.models.config import GPTConfig
from lamina.models.gpt import GPT
from lamina.tokenizers.kinds import CharTokenizer
from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.session import new_session

OLD = "the old text of the source model, said the cat.\n" * 40
NEW = "".join(f"a new tale: {i} birds sang at dawn.\n" for i in range(200))


def source(tmp_path, text=OLD + NEW, unk=None):
    torch.manual_seed(0)
    tok = CharTokenizer.from_text(text, unk=unk)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=16))
    lamina.save(tmp_path / "src", model, tok)
    (tmp_path / "new.txt").write_text(NEW)
    return tmp_path / "src", model


def cfg(tmp_path, src, **kw) -> TrainConfig:
    base = dict(data=str(tmp_path / "new.txt"), init_from=str(src), batch_size=8, max_steps=20,
                eval_batches=2, eval_every=20, device="cpu", lr=3e-3)  # fmt: skip
    return TrainConfig(**{**base, **kw})


def test_first_step_is_the_source_and_the_fine_tune_learns(tmp_path):
    src, model = source(tmp_path)
    probe = new_session(cfg(tmp_path, src), out=None)
    batch = probe.objective.draw(8)
    with torch.no_grad():
        want = float(probe.objective.loss(model, batch))
    s = new_session(cfg(tmp_path, src), out=tmp_path / "run")
    assert s.cfg.preset is None and s.cfg.warmup == 10
    result = run_training(s, quiet=True)
    assert result.losses[1] == pytest.approx(want, abs=1e-5)  # the weights were loaded
    evals = [m["val_loss"] for m in s.state.metrics if "val_loss" in m]
    assert evals[-1] < evals[0] - 0.3
    tuned, _ = lamina.load(tmp_path / "run")
    moved = [
        not torch.equal(a, b) for a, b in zip(tuned.parameters(), model.parameters(), strict=True)
    ]
    assert all(moved)
    record = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert record["init_from"]["source"] == str(src.resolve())
    assert record["init_from"]["format"] == "lamina" and record["train"]["lr"] == 3e-3


def test_source_shape_and_tokenizer_win(tmp_path, capsys):
    src, _ = source(tmp_path)
    args = ["train", "--init-from", str(src), "--data", str(tmp_path / "new.txt"),
            "--max-steps", "1", "--batch-size", "2", "--eval-batches", "1", "--quiet"]  # fmt: skip
    assert main([*args, "--n-layers", "5", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--n-layers 5 disagrees" in err and "n_layers is 2" in err
    assert main([*args, "--preset", "tiny", "--out", str(tmp_path / "b")]) == 2
    assert "--preset and --init-from" in capsys.readouterr().err
    (tmp_path / "new.txt").write_text(NEW + "Zebra!\n")
    assert main([*args, "--out", str(tmp_path / "c")]) == 2
    assert f"character 'Z' at position {len(NEW)}" in capsys.readouterr().err


def test_unk_maps_unknown_characters(tmp_path):
    src, _ = source(tmp_path, unk="?")
    (tmp_path / "new.txt").write_text(NEW + "Zebra!\n")
    s = new_session(cfg(tmp_path, src, max_steps=1), out=None)
    assert s.tokenizer.unk == "?"


def test_bad_sources_exit_2(tmp_path, capsys):
    src, _ = source(tmp_path)
    base = ["train", "--data", str(tmp_path / "new.txt"), "--max-steps", "1", "--quiet"]
    (tmp_path / "empty").mkdir()
    assert main([*base, "--init-from", str(tmp_path / "empty"), "--out", str(tmp_path / "a")]) == 2
    assert "is not a model: it has no config.json" in capsys.readouterr().err
    conf = json.loads((src / "config.json").read_text())
    conf["model"]["n_layers"] = 3
    (src / "config.json").write_text(json.dumps(conf))
    assert main([*base, "--init-from", str(src), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing keys: blocks.2" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_fine_tune_a_converted_gpt2_and_a_lamina_run_from_the_cli(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_cfg = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2,
                                     n_head=4, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=None, eos_token_id=None)  # fmt: skip
    transformers.GPT2LMHeadModel(hf_cfg).save_pretrained(tmp_path / "hf")
    (tmp_path / "new.txt").write_text(NEW)
    conv = tmp_path / "conv"
    assert main(["convert", "--from", "hf", str(tmp_path / "hf"), "--out", str(conv)]) == 0
    base = ["train", "--data", str(tmp_path / "new.txt"), "--max-steps", "3", "--batch-size",
            "4", "--eval-batches", "1", "--quiet"]  # fmt: skip
    assert main([*base, "--init-from", str(conv), "--out", str(tmp_path / "a")]) == 2
    assert "has no tokenizer.json; pass --tokenizer byte" in capsys.readouterr().err
    for src, out in ((conv, "a"), (tmp_path / "hf", "b")):
        args = [*base, "--init-from", str(src), "--tokenizer", "byte", "--out", str(tmp_path / out)]
        assert main(args) == 0
    record = json.loads((tmp_path / "b" / "train_config.json").read_text())
    assert record["init_from"]["format"] == "hf" and record["model"]["d_model"] == 32
    again = [*base, "--init-from", str(tmp_path / "a"), "--out", str(tmp_path / "c")]
    assert main(again) == 0  # a lamina run (with the byte tokenizer it saved)
    capsys.readouterr()


def test_prepared_data_must_use_the_source_tokenizer(tmp_path, capsys):
    src, model = source(tmp_path)
    new = str(tmp_path / "new.txt")
    assert (
        main(["prepare", new, "--tokenizer", str(src), "--out", str(tmp_path / "p"), "--quiet"])
        == 0
    )
    s = new_session(cfg(tmp_path, src, data=str(tmp_path / "p")), out=None)
    assert s.tokenizer == lamina.load(src)[1] and s.cfg.tokenizer == str(src)
    assert main(["prepare", new, "--out", str(tmp_path / "q"), "--quiet"]) == 0  # its own chars
    args = ["train", "--init-from", str(src), "--data", str(tmp_path / "q"), "--quiet",
            "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(args) == 2
    assert "prepared with another tokenizer" in capsys.readouterr().err


def test_fine_tuning_trains_on_windows_of_at_most_256_tokens_unless_told():
    """A real model's 8k block would make one CPU step take minutes: --init-from trains on
    windows of at most FINE_TUNE_SEQ_LEN tokens unless --seq-len says otherwise; the model's
    own block_size is kept."""
    from lamina.errors import LaminaError
    from lamina.models import GPTConfig
    from lamina.training.config import FINE_TUNE_SEQ_LEN, TrainConfig
    from lamina.training.lm import train_window

    big = GPTConfig.preset("llama-tiny", vocab_size=50, block_size=8192)
    small = GPTConfig.preset("llama-tiny", vocab_size=50, block_size=64)
    assert train_window(TrainConfig(init_from="m"), big) == FINE_TUNE_SEQ_LEN
    assert train_window(TrainConfig(init_from="m"), small) == 64
    assert train_window(TrainConfig(), big) == 8192  # from scratch: the preset's block
    assert train_window(TrainConfig(init_from="m", seq_len=1024), big) == 1024
    with pytest.raises(LaminaError, match="longer than the model's block_size"):
        train_window(TrainConfig(init_from="m", seq_len=128), small)
