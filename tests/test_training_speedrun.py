"""Issue 12's levers: --optimizer muon, per-group learning rates, --decay wsd, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.errors import LaminaError
from lamina.training.config import TrainConfig
from lamina.training.loop import run_training
from lamina.training.muon import MuonAdamW
from lamina.training.optim import build_optimizer, param_groups
from lamina.training.schedule import lr_at
from lamina.training.session import new_session, resume_session


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", vocab_size=20, block_size=16, **kw))


@pytest.mark.parametrize("tied", [True, False])
def test_muon_groups_hold_the_blocks_matrices_and_adamw_the_rest(tied):
    model = tiny(tie_weights=tied)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, 0.1, embed_lr_scale=2.0, head_lr_scale=3.0, muon=True)
    where = {names[id(p)]: g for g in groups for p in g["params"]}
    assert len(where) == sum(len(g["params"]) for g in groups)  # each tensor once
    assert set(where) == set(names.values())
    for name, g in where.items():
        p = dict(model.named_parameters())[name]
        in_block = name.startswith("blocks.") and p.dim() == 2
        assert g["kind"] == ("muon" if in_block else "adamw"), name
        assert g["weight_decay"] == (0.1 if p.dim() == 2 else 0.0), name
    assert where["embed.wte.weight"]["lr_scale"] == 2.0
    assert where["embed.wpe.weight"]["lr_scale"] == 2.0
    if tied:  # the tied head is the token table: embedding, and no head group
        assert "head.weight" not in where
        assert all(g["lr_scale"] != 3.0 for g in groups)
    else:
        assert where["head.weight"]["lr_scale"] == 3.0 and where["head.weight"]["kind"] == "adamw"
    assert where["norm_f.weight"]["lr_scale"] == 1.0


def test_adamw_groups_with_scales_one_are_the_historical_two():
    """Old checkpoints (two AdamW groups) still load: same groups and order as before."""
    model = tiny()
    groups = param_groups(model, 0.1)
    assert len(groups) == 2 and [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert [p.dim() >= 2 for p in groups[0]["params"]] == [True] * len(groups[0]["params"])
    assert len(param_groups(model, 0.0)) == 2  # no decay still keeps the two groups


def test_build_optimizer_chooses_and_refuses():
    assert isinstance(build_optimizer(tiny(), 1e-3, optimizer="muon"), MuonAdamW)
    opt = build_optimizer(tiny(), 1e-3, optimizer="muon", ns_dtype="bf16")
    assert opt.ns_dtype == torch.bfloat16
    assert isinstance(build_optimizer(tiny(), 1e-3), torch.optim.AdamW)
    only_tables = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4))
    with pytest.raises(LaminaError, match="no 2-D weight matrices"):
        build_optimizer(only_tables, 1e-3, optimizer="muon")
    with pytest.raises(LaminaError, match="optimizer"):
        build_optimizer(tiny(), 1e-3, optimizer="sgd")


def cfg(corpus, **kw) -> TrainConfig:
    base = dict(data=corpus, preset="tiny", batch_size=4, max_steps=6, eval_every=6,
                eval_batches=1, log_every=1, warmup=2, lr=3e-3,
                model_overrides={"block_size": 16, "tie_weights": False})  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_loop_applies_each_groups_lr_scale(corpus, tmp_path, optimizer):
    s = new_session(
        cfg(corpus, optimizer=optimizer, embed_lr_scale=0.5, head_lr_scale=4.0), out=None
    )
    result = run_training(s, quiet=True)
    lr = lr_at(5, 6, 3e-3, warmup=2, floor_ratio=s.cfg.min_lr_ratio, kind="cosine")
    by_param = {id(p): g for g in s.opt.param_groups for p in g["params"]}
    assert by_param[id(s.model.embed.wte.weight)]["lr"] == pytest.approx(0.5 * lr)
    assert by_param[id(s.model.head.weight)]["lr"] == pytest.approx(4.0 * lr)
    assert by_param[id(s.model.norm_f.weight)]["lr"] == pytest.approx(lr)
    assert result.step == 6
    assert isinstance(s.opt, MuonAdamW) == (optimizer == "muon")


def test_muon_run_resumes_with_muon_and_its_buffers(corpus, tmp_path):
    run_training(new_session(cfg(corpus, optimizer="muon"), out=tmp_path / "r"), quiet=True)
    back = resume_session(tmp_path / "r", {})
    back.run.release()
    assert isinstance(back.opt, MuonAdamW) and back.cfg.optimizer == "muon"
    bufs = [st for st in back.opt.state.values() if "momentum_buffer" in st]
    assert bufs and any(float(st["momentum_buffer"].abs().sum()) > 0 for st in bufs)
    with pytest.raises(LaminaError, match="optimizer"):
        resume_session(tmp_path / "r", {"optimizer": "adamw"})


def test_wsd_shape_at_known_steps():
    """Warmup 10, 100 steps, decay over the last 20: rise, flat at peak, linear to the floor."""
    lr = [lr_at(s, 100, 1.0, warmup=10, floor_ratio=0.1, kind="wsd") for s in range(100)]
    assert lr[0] == pytest.approx(1 / 11) and lr[9] == pytest.approx(10 / 11)
    assert lr[10:81] == [1.0] * 71  # stable through step 80, the decay's first step
    assert lr[81] == pytest.approx(1.0 - 0.9 / 19)
    assert lr[90] == pytest.approx(1.0 - 0.9 * 10 / 19)
    assert lr[99] == pytest.approx(0.1)
    assert lr_at(150, 100, 1.0, warmup=10, floor_ratio=0.1, kind="wsd") == pytest.approx(0.1)
    # re-estimated totals (TimeBudget) move the decay with them: the same step is stable in a
    # longer run and decaying in a shorter one
    assert lr_at(70, 200, 1.0, warmup=10, kind="wsd") == 1.0
    assert lr_at(70, 80, 1.0, warmup=10, kind="wsd") < 1.0
    # decay_fraction 1: a linear decay from the end of warmup
    full = [lr_at(s, 50, 1.0, warmup=5, floor_ratio=0.0, kind="wsd", decay_fraction=1.0)
            for s in range(5, 50)]  # fmt: skip
    lin = [lr_at(s, 50, 1.0, warmup=5, floor_ratio=0.0, kind="linear") for s in range(5, 50)]
    assert full == pytest.approx(lin)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, float("nan")])
def test_decay_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(LaminaError, match=rf"decay_fraction must be in \(0, 1\], got {bad!r}"):
        TrainConfig(decay="wsd", decay_fraction=bad)
    with pytest.raises(LaminaError, match="decay_fraction"):
        lr_at(0, 10, 1.0, kind="wsd", decay_fraction=bad)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--optimizer", "sgd"], "invalid choice: 'sgd'"),
        (["--decay", "wsd", "--decay-fraction", "1.5"], "decay_fraction must be in (0, 1]"),
        (["--decay", "cosine", "--decay-fraction", "0.4"], "shapes only --decay wsd"),
        (["--muon-ns-dtype", "fp16"], "invalid choice: 'fp16'"),
        (["--optimizer", "muon", "--fsdp", "--nproc", "2"], "--fsdp"),
        (["--embed-lr-scale", "0"], "embed_lr_scale must be a positive number"),
    ],
)
def test_cli_refuses_bad_levers_in_one_line(corpus, tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["train", "--data", corpus, "--out", str(tmp_path / "r"), *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_help_lists_the_new_options_with_their_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for text in (
        "--optimizer {adamw,muon}",
        "--muon-ns-dtype {fp32,bf16}",
        "--decay {cosine,linear,wsd}",
        "(default: muon on a CPU, adamw on a GPU and for first-last; adamw with --init-from; "
        "adamw with --fsdp)",
        "(default: bf16 on a GPU and where the CPU has AVX512-BF16 or AMX",
        "--decay-fraction F",
        "(default: 0.2)",
        "--embed-lr-scale X",
        "--head-lr-scale X",
    ):
        assert text in out, text


def test_a_run_recorded_before_the_new_fields_resumes_with_adamw(corpus, tmp_path):
    """train_config.json without optimizer / lr scales / decay_fraction: what ran then."""
    old = cfg(corpus, max_steps=2, optimizer="adamw")  # what every run used before
    run_training(new_session(old, out=tmp_path / "r"), quiet=True)
    path = tmp_path / "r" / "train_config.json"
    saved = json.loads(path.read_text())
    for name in ("optimizer", "muon_ns_dtype", "embed_lr_scale", "head_lr_scale",
                 "decay_fraction"):  # fmt: skip
        saved["train"].pop(name)
    path.write_text(json.dumps(saved))
    back = resume_session(tmp_path / "r", {"max_steps": 3})
    assert back.cfg.optimizer == "adamw" and back.cfg.embed_lr_scale == 1.0
    assert run_training(back, quiet=True).step == 3
    back.run.release()


def test_muon_on_the_encoder_classifier_keeps_its_output_layer_on_adamw():
    from lamina.models.config import EncoderConfig
    from lamina.models.encoder import SequenceClassifier

    torch.manual_seed(0)
    m = SequenceClassifier(EncoderConfig(vocab_size=16, max_len=8, d_model=16, n_heads=2,
                                         n_layers=1, d_ff=32), n_classes=3)  # fmt: skip
    names = {id(p): n for n, p in m.named_parameters()}
    groups = param_groups(m, 0.1, head_lr_scale=2.0, muon=True)
    kind = {names[id(p)]: (g["kind"], g["lr_scale"]) for g in groups for p in g["params"]}
    assert kind["classifier.weight"] == ("adamw", 2.0)
    assert kind["encoder.embed.wte.weight"] == ("adamw", 1.0)
    assert kind["encoder.layers.0.ff.fc.weight"] == ("muon", 1.0)
