"""`lamina convert`: HF folder -> lamina run -> HF folder, tokenizers carried, bad input exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.tokenizers.subword import BPETokenizer, ByteTokenizer, GPT2Tokenizer

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()


def hf_model(tmp_path: Path, **overrides) -> tuple[Path, object]:
    cfg = dict(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    cfg.update(overrides)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(bos_token_id=None, eos_token_id=None, **cfg)
    ).eval()
    d = tmp_path / "hf"
    model.save_pretrained(d)
    return d, model


def test_from_hf_then_to_hf(tmp_path, capsys):
    """--from hf writes a lamina model folder; --to hf writes one transformers loads, same logits."""
    d, hf = hf_model(tmp_path)
    assert main(["convert", "--from", "hf", str(d), "--out", str(tmp_path / "run")]) == 0
    assert "wrote" in capsys.readouterr().out
    model, tokenizer = lamina.load(tmp_path / "run")
    assert tokenizer is None
    ids = torch.arange(16).view(1, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=1e-4, rtol=0)
    assert main(["convert", "--to", "hf", str(tmp_path / "run"), "--out", str(tmp_path / "x")]) == 0
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "x")
    assert all(torch.equal(v, hf.state_dict()[k]) for k, v in back.state_dict().items())


def test_gpt2_tokenizer_travels_both_ways(tmp_path, shared_data):
    """A run with the gpt2 tokenizer exports vocab.json + merges.txt that transformers reads,
    and importing that folder brings the gpt2 tokenizer back."""
    d = shared_data / "gpt2-tokenizer"
    if not (d / "vocab.bpe").is_file():
        pytest.skip("no GPT-2 tokenizer files")
    tok = GPT2Tokenizer.from_dir(d)
    lamina.save(tmp_path / "run", GPT(GPTConfig.preset("tiny", vocab_size=50257)), tok)
    assert (
        main(["convert", "--to", "hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    )
    text = "Hello world, it's <|endoftext|> 2024!\n\n  ok"
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok(text)["input_ids"] == tok.encode(text)
    assert (
        main(["convert", "--from", "hf", str(tmp_path / "hf"), "--out", str(tmp_path / "r2")]) == 0
    )
    _, back = lamina.load(tmp_path / "r2")
    assert isinstance(back, GPT2Tokenizer) and back.encode(text) == tok.encode(text)


def test_broken_tokenizer_files_exit_2(tmp_path, shared_data, capsys):
    """GPT-2's merges.txt next to a vocab.json that is broken or different: exit 2, one line."""
    src = shared_data / "gpt2-tokenizer"
    if not (src / "vocab.bpe").is_file():
        pytest.skip("no GPT-2 tokenizer files")
    d, _ = hf_model(tmp_path)
    shutil.copy(src / "vocab.bpe", d / "merges.txt")
    for vocab, match in [("{broken", "not valid JSON"), ('{"a": 0}', "does not match GPT-2")]:
        (d / "vocab.json").write_text(vocab)
        out = tmp_path / "out"
        assert main(["convert", "--from", "hf", str(d), "--out", str(out)]) == 2
        assert match in one_error_line(capsys)
        assert not out.exists()


def test_bpe_tokenizer_travels_both_ways(tmp_path):
    """A bpe run exports tokenizer.json that transformers' AutoTokenizer reads with equal ids."""
    text = "the quick brown fox jumps over the lazy dog. " * 50
    tok = BPETokenizer.train(text, 300)
    lamina.save(tmp_path / "run", GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size)), tok)
    assert (
        main(["convert", "--to", "hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    )
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    sample = "the lazy fox<|endoftext|> é"
    assert hf_tok(sample)["input_ids"] == tok.encode(sample)
    assert (
        main(["convert", "--from", "hf", str(tmp_path / "hf"), "--out", str(tmp_path / "r2")]) == 0
    )
    assert lamina.load(tmp_path / "r2")[1].encode(sample) == tok.encode(sample)


def test_byte_tokenizer_run_exports_weights_only(tmp_path, capsys):
    """A tokenizer kind Hugging Face lacks: weights and config exported, the output says so."""
    lamina.save(tmp_path / "run", GPT(GPTConfig.preset("tiny", vocab_size=256)), ByteTokenizer())
    assert (
        main(["convert", "--to", "hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    )
    assert "no Hugging Face tokenizer files (tokenizer: byte)" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        ".lamina",
        "config.json",
        "model.safetensors",
    ]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("lamina convert: error: "), err
    return err


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    """No weights, foreign config, unsafe pickle, post-LN export: exit 2, one line, no --out."""
    d, _ = hf_model(tmp_path)
    out = tmp_path / "out"
    (d / "model.safetensors").unlink()
    assert main(["convert", "--from", "hf", str(d), "--out", str(out)]) == 2
    assert "has no weights" in one_error_line(capsys)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    assert main(["convert", "--from", "hf", str(d), "--out", str(out)]) == 2
    assert "model_type 'bert' is not one lamina runs" in one_error_line(capsys)
    lamina.save(tmp_path / "postln", GPT(GPTConfig.preset("tiny", norm_first=False)))
    assert main(["convert", "--to", "hf", str(tmp_path / "postln"), "--out", str(out)]) == 2
    assert "cannot save as Hugging Face GPT-2: norm_first=False" in one_error_line(capsys)
    assert main(["convert", "--to", "hf", str(tmp_path / "nothing"), "--out", str(out)]) == 2
    one_error_line(capsys)
    assert not out.exists()


def test_out_must_be_new_or_empty_unless_forced(tmp_path, capsys):
    """--out holding files is refused (exit 2) unless --force (and lamina wrote it); an empty
    folder is fine."""
    d, _ = hf_model(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    assert main(["convert", "--from", "hf", str(d), "--out", str(out)]) == 0
    assert main(["convert", "--from", "hf", str(d), "--out", str(out)]) == 2
    assert "already exists" in one_error_line(capsys)
    assert main(["convert", "--from", "hf", str(d), "--out", str(out), "--force"]) == 0
    shutil.rmtree(out)


def test_help_and_required_direction(capsys):
    """`lamina convert` needs exactly one of --from / --to (argparse exits 2)."""
    with pytest.raises(SystemExit) as e:
        main(["convert", "somewhere", "--out", "x"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["convert", "--help"])
    assert e.value.code == 0
    assert "--from" in capsys.readouterr().out


@pytest.mark.parametrize(
    "overrides, setting",
    [
        ({"positions": "rope", "norm": "rms", "activation": "relu2"}, "activation='relu2'"),
        ({"positions": "rope", "norm": "rms", "activation": "swiglu", "qk_norm": True}, "qk_norm"),
        ({"positions": "rope", "activation": "swiglu"}, "norm='layer'"),
        ({"n_kv_heads": 2}, "n_kv_heads=2"),
        ({"logit_softcap": 10.0}, "logit_softcap=10.0"),
    ],
)
def test_options_hf_cannot_express_exit_2_naming_them(tmp_path, capsys, overrides, setting):
    """A rotary model goes out as a Llama, any other as GPT-2; each refuses what it lacks."""
    config = GPTConfig.preset("tiny", **overrides)
    lamina.save(tmp_path / "run", GPT(config))
    out = tmp_path / "out"
    assert main(["convert", "--to", "hf", str(tmp_path / "run"), "--out", str(out)]) == 2
    assert setting in one_error_line(capsys)
    assert not out.exists()


def test_llama_rope_scaling_is_refused_in_one_line(tmp_path, capsys):
    d = tmp_path / "hf"
    d.mkdir()
    config = {"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    (d / "config.json").write_text(json.dumps(config))
    assert main(["convert", "--from", "hf", str(d), "--out", str(tmp_path / "out")]) == 2
    assert "rope_scaling type 'dynamic'" in one_error_line(capsys)
