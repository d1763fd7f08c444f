"""Issue 35, classes 2 (LoRA bases), 4, 5, 6 and 10: every writer goes through lamina.files, and
every verb's output check knows every file the opened model read (a LoRA run's base included);
a LoRA base is recorded by its content and found beside the run; a loop of bases is one line."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.cli import main
from lamina.interop.adapters import save_lora_folder
from lamina.interop.gguf_write import save_gguf
from lamina.interop.origin import files_read
from lamina.lora import apply_lora
from lamina.tokenizers.kinds import CharTokenizer


def _tiny(vocab: int) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig.preset("llama-tiny", vocab_size=vocab, d_model=32, n_layers=1, d_ff=64)
    return GPT(cfg)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A lamina base folder, a GGUF base, and a LoRA run on each."""
    d = tmp_path_factory.mktemp("lora")
    tok = CharTokenizer.from_text("abcdefgh \n")
    lamina.save(d / "base", _tiny(tok.vocab_size), tok)
    save_gguf(_tiny(tok.vocab_size), d / "base.gguf")
    for base, run in ((d / "base", d / "run"), (d / "base.gguf", d / "grun")):
        bundle = lamina.open(base)
        model = apply_lora(bundle.model, r=2, alpha=4, targets="all")
        save_lora_folder(run, model, bundle.origin.to_dict())
    return d


def _with_base(run: Path, path: str) -> None:
    config = json.loads((run / "config.json").read_text())
    config["base"]["path"] = path
    (run / "config.json").write_text(json.dumps(config))


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_lora_base_that_is_itself_or_loops_is_one_line(made, tmp_path):
    me = _copy(made / "run", tmp_path / "me")
    _with_base(me, str(me))
    with pytest.raises(LaminaError, match="chain of LoRA bases loops"):
        lamina.open(me)
    a, b = _copy(made / "run", tmp_path / "a"), _copy(made / "run", tmp_path / "b")
    _with_base(a, str(b))
    _with_base(b, str(a))
    with pytest.raises(LaminaError, match=r"loops \(.*a -> .*b -> .*a\)"):
        lamina.open(a)
    assert files_read(a)  # the listing stops at the loop too


def test_the_base_record_is_the_content_hash_and_a_renamed_copy_opens(made, tmp_path):
    record = json.loads((made / "grun" / "config.json").read_text())["base"]
    assert record["sha256"] == hashlib.sha256((made / "base.gguf").read_bytes()).hexdigest()
    run = _copy(made / "grun", tmp_path / "grun")
    (tmp_path / "renamed.gguf").write_bytes((made / "base.gguf").read_bytes())
    _with_base(run, str(tmp_path / "renamed.gguf"))
    assert lamina.open(run).origin.kind == "model"


def test_a_relative_base_is_found_beside_the_run_not_the_working_directory(
    made, tmp_path, monkeypatch
):
    run = _copy(made / "grun", tmp_path / "runs" / "grun")
    (tmp_path / "runs" / "base.gguf").write_bytes((made / "base.gguf").read_bytes())
    _with_base(run, "../base.gguf")
    monkeypatch.chdir(made)  # where a ../base.gguf does not exist
    assert (tmp_path / "runs" / "base.gguf").resolve() in lamina.open(run).origin.read


def test_merge_never_replaces_a_folder_that_is_not_lamina_s(made, tmp_path, capsys):
    holder = tmp_path / "holder"
    base = _copy(made / "base", holder / "base")
    (holder / "notes.txt").write_text("mine")
    run = _copy(made / "run", tmp_path / "run")
    _with_base(run, str(base))
    for flag in ("--out", "--peft"):
        assert main(["merge", str(run), flag, str(holder), "--force"]) == 2
        assert "holds RUN's file" in capsys.readouterr().err
    assert (holder / "notes.txt").read_text() == "mine" and (base / "model.safetensors").is_file()


def test_merge_writes_a_marked_folder_and_checks_its_target_first(made, tmp_path, capsys):
    out = tmp_path / "merged"
    assert main(["merge", str(made / "run"), "--out", str(out)]) == 0
    assert (out / ".lamina").is_file() and stat.S_IMODE(out.stat().st_mode) != 0o700
    assert main(["merge", str(made / "run"), "--out", str(out), "--force"]) == 0  # lamina's own
    (tmp_path / "file").write_text("x")
    for target in ("/proc/lamina-merge", str(tmp_path / "file" / "under")):
        for verb in (
            ["merge", str(made / "run")],
            ["quantize", str(made / "base"), "--to", "int8"],
        ):
            capsys.readouterr()
            assert main([*verb, "--out", target]) == 2
            err = capsys.readouterr().err
            assert f"--out {target}" in err and ".new-" not in err and err.count("\n") == 1


def test_convert_to_gguf_writes_through_lamina_files(made, tmp_path, capsys):
    src = _copy(made / "base", tmp_path / "src")
    weights = (src / "model.safetensors").read_bytes()
    args = ["convert", "--to", "gguf", str(src), "--out"]
    assert main([*args, str(src / "model.safetensors"), "--force"]) == 2
    assert main([*args, str(src / "model.gguf")]) == 2  # inside SOURCE: refused too
    assert (src / "model.safetensors").read_bytes() == weights
    assert "SOURCE" in capsys.readouterr().err
    real = tmp_path / "real.gguf"
    real.write_bytes(b"old")
    (tmp_path / "link.gguf").symlink_to(real)
    assert main([*args, str(tmp_path / "link.gguf"), "--force"]) == 0
    assert (tmp_path / "link.gguf").is_symlink() and real.read_bytes()[:4] == b"GGUF"
    os.mkfifo(tmp_path / "fifo")
    assert main([*args, str(tmp_path / "fifo"), "--force"]) == 2  # refused, not hung
    assert stat.S_ISFIFO((tmp_path / "fifo").stat().st_mode)
    assert "FIFO" in capsys.readouterr().err
    assert main([*args, os.devnull, "--force"]) == 0  # a character device is written to
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    if os.path.exists("/dev/full"):  # written to, not replaced; its error names it
        capsys.readouterr()
        assert main([*args, "/dev/full", "--force"]) == 2
        assert capsys.readouterr().err.endswith("No space left on device: /dev/full\n")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_eval_output_never_overwrites_a_file_the_model_reads(made, tmp_path, capsys):
    task = tmp_path / "task.jsonl"
    task.write_text(json.dumps({"context": "a", "choices": ["b", "c"], "gold": 0}) + "\n")
    hf = tmp_path / "hf"
    lamina.save_hf(_tiny(11), hf)
    (hf / "tokenizer_config.json").write_text("{}")
    (hf / "generation_config.json").write_text("{}")
    cases = [
        (made / "grun", made / "grun" / "adapters.safetensors"),
        (made / "grun", made / "base.gguf"),  # the LoRA run's base
        (made / "run", made / "base" / "tokenizer.json"),  # the base folder's tokenizer
        (hf, hf / "tokenizer_config.json"),
        (hf, hf / "generation_config.json"),
    ]
    for model, output in cases:
        before = output.read_bytes()
        assert main(["eval", str(model), "--task", str(task), "--output", str(output)]) == 2
        assert "is MODEL" in capsys.readouterr().err
        assert output.read_bytes() == before
