"""`lamina convert --to gguf` / `--from gguf`: round trips through the CLI, tokenizers carried,
bad input refused in one line with exit status 2 and nothing written."""

from __future__ import annotations

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.interop.gguf import load_gguf, read_gguf
from lamina.tokenizers.subword import BPETokenizer

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", d_model=64, n_layers=2)).eval()
    d = tmp_path_factory.mktemp("runs") / "llama"
    lamina.save(d, model)
    return d, model


def _logits(model, n: int = 24) -> torch.Tensor:
    ids = torch.arange(n).view(1, n) % model.config.vocab_size
    with torch.no_grad():
        return model(ids)


def test_to_gguf_then_from_gguf(llama_run, tmp_path, capsys):
    run, model = llama_run
    f = tmp_path / "m.gguf"
    assert main(["convert", "--to", "gguf", str(run), "--out", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {f} (llama, f32, ") and "no GGUF tokenizer" in out
    assert main(["convert", "--from", "gguf", str(f), "--out", str(tmp_path / "back")]) == 0
    assert "llama" in capsys.readouterr().out
    back, _ = lamina.load(tmp_path / "back")
    assert torch.equal(_logits(back), _logits(model))


@pytest.mark.parametrize("qtype", ["f16", "q8_0"])
def test_to_gguf_type(llama_run, tmp_path, qtype):
    run, model = llama_run
    f = tmp_path / "m.gguf"
    assert main(["convert", "--to", "gguf", str(run), "--out", str(f), "--type", qtype]) == 0
    assert qtype.upper() in {t.qtype for t in read_gguf(f).tensors.values()}
    back, _ = load_gguf(f)
    want, got = _logits(model), _logits(back)
    assert 0 < (want - got).abs().max() < 0.05 * want.abs().max()


def test_bpe_tokenizer_goes_into_the_gguf(tmp_path, capsys):
    text = "the quick brown fox jumps over the lazy dog. " * 40
    tok = BPETokenizer.train(text, 300)
    model = GPT(GPTConfig.preset("tiny", vocab_size=320))
    lamina.save(tmp_path / "run", model, tok)
    f = tmp_path / "m.gguf"
    assert main(["convert", "--to", "gguf", str(tmp_path / "run"), "--out", str(f)]) == 0
    assert "gpt2, f32" in capsys.readouterr().out
    meta = read_gguf(f).metadata
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == 320 and tokens[tok.vocab_size :] == [
        f"[PAD{i}]" for i in range(tok.vocab_size, 320)
    ]
    eot = tok.special_tokens["<|endoftext|>"]
    assert (
        meta["tokenizer.ggml.eos_token_id"] == eot and meta["tokenizer.ggml.token_type"][eot] == 3
    )
    ids = tok.encode("the lazy fox")
    assert "".join(tokens[i] for i in ids).replace("\u0120", " ") == "the lazy fox"
    assert meta["tokenizer.ggml.merges"][0].count(" ") == 1


def _refused(args: list[str], capsys, message: str) -> None:
    assert main(["convert", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_bad_input_is_one_line_and_exit_2(llama_run, tmp_path, capsys):
    run, _ = llama_run
    f = tmp_path / "m.gguf"
    _refused(["--to", "hf", str(run), "--out", str(tmp_path / "x"), "--type", "f16"], capsys,
             "--type applies to --to gguf only")  # fmt: skip
    f.write_bytes(b"old")
    _refused(["--to", "gguf", str(run), "--out", str(f)], capsys, "already exists")
    assert f.read_bytes() == b"old"
    _refused(["--to", "gguf", str(run), "--out", str(tmp_path)], capsys, "is a folder")
    _refused(["--from", "gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "o")],
             capsys, "not found; expected a .gguf file")  # fmt: skip
    _refused(["--from", "gguf", str(f), "--out", str(tmp_path / "o")], capsys, "not a GGUF file")
    assert not (tmp_path / "o").exists()
    post_ln = tmp_path / "post"
    lamina.save(post_ln, GPT(GPTConfig.preset("tiny", norm_first=False)))
    _refused(["--to", "gguf", str(post_ln), "--out", str(tmp_path / "p.gguf")], capsys,
             "cannot save as GGUF")  # fmt: skip
    assert not (tmp_path / "p.gguf").exists()


def test_a_tokenizer_gguf_cannot_hold_is_one_warning(tmp_path, capsys):
    from lamina.tokenizers.subword import ByteTokenizer

    lamina.save(tmp_path / "run", GPT(GPTConfig.preset("tiny", vocab_size=256)), ByteTokenizer())
    f = tmp_path / "m.gguf"
    assert main(["convert", "--to", "gguf", str(tmp_path / "run"), "--out", str(f)]) == 0
    captured = capsys.readouterr()
    assert (
        captured.err.count("\n") == 1
        and "warning: GGUF written without a tokenizer" in captured.err
    )
    assert "no GGUF tokenizer (tokenizer: byte)" in captured.out
    assert read_gguf(f).metadata["tokenizer.ggml.model"] == "none"
