"""`lamina train --init-from MODEL --lora`: only adapters are trained and saved (with the base's
path and sha256), a resume is exact, sample/eval/merge read the run, the memory check counts
LoRA as LoRA, and --task sft trains on chat data with the prompt masked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main
from lamina.lora import LoRAConfig, lora_config
from lamina.lora_size import fit_bytes
from lamina.models.params import count_params
from lamina.tokenizers.kinds import CharTokenizer

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-train")
    (d / "corpus.txt").write_text(TEXT * 60, encoding="utf-8")
    tok = CharTokenizer.from_text(TEXT + "?=0123456789yesno")
    torch.manual_seed(0)
    cfg = GPTConfig.preset(
        "llama-tiny", vocab_size=tok.vocab_size, d_model=32, n_layers=2, d_ff=64, block_size=32
    )
    lamina.save(d / "base", GPT(cfg), tok)
    return d


def _train(base, out, *extra):
    args = ["train", "--init-from", str(base / "base"), "--data", str(base / "corpus.txt")]
    args += ["--batch-size", "4", "--out", str(out), "--quiet", "--lora", "--lora-r", "4"]
    return main([*args, *extra])


def test_a_lora_run_saves_adapters_and_resumes_exactly(base, tmp_path, capsys):
    assert _train(base, tmp_path / "straight", "--max-steps", "4", "--seed", "3") == 0
    assert _train(base, tmp_path / "split", "--max-steps", "2", "--seed", "3") == 0
    args = ["train", "--resume", str(tmp_path / "split"), "--max-steps", "4", "--quiet"]
    assert main(args) == 0
    capsys.readouterr()
    files = {p.name for p in (tmp_path / "straight").iterdir()}
    assert "adapters.safetensors" in files and "model.safetensors" not in files
    config = json.loads((tmp_path / "straight" / "config.json").read_text())
    assert config["kind"] == "lora" and config["base"]["path"] == str(base / "base")
    a = load_file(tmp_path / "straight" / "adapters.safetensors")
    b = load_file(tmp_path / "split" / "adapters.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.startswith("blocks.0.attn.qkv.lora_B.") and a[k].abs().sum() > 0 for k in a)
    base_bytes = (base / "base" / "model.safetensors").stat().st_size
    assert (tmp_path / "straight" / "adapters.safetensors").stat().st_size < 0.5 * base_bytes


def test_sample_eval_and_merge_read_a_lora_run(base, tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(base, run, "--max-steps", "2") == 0
    capsys.readouterr()
    opened = lamina.open(run)
    assert lora_config(opened.model).r == 4 and opened.origin.kind == "run"
    args = ["sample", str(run), "--prompt", "First", "--max-new-tokens", "4", "--seed", "1"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("First")
    assert main(["eval", str(run), "--json"]) == 0
    assert "loss" in json.loads(capsys.readouterr().out)
    assert main(["merge", str(run), "--out", str(tmp_path / "merged")]) == 0
    merged, _ = lamina.load(tmp_path / "merged")
    ids = torch.randint(0, merged.config.vocab_size, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(merged(ids), opened.model(ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_qlora_trains_adapters_over_a_quantized_base(base, tmp_path, capsys, scheme, monkeypatch):
    import lamina.frozen_linear as fl

    kept = []  # the buffers in use while training: W went into them, not fresh tensors
    read = fl.dequantized

    def spy(*args, **kwargs):
        kept.append(bool(getattr(fl._KEPT, "buffers", None)))
        return read(*args, **kwargs)

    monkeypatch.setattr(fl, "dequantized", spy)
    run = tmp_path / scheme
    assert _train(base, run, "--max-steps", "2", "--lora-base", scheme) == 0
    assert kept and any(kept) and fl._KEPT.buffers == {}  # used, and freed after the run
    a = load_file(run / "adapters.safetensors")
    assert any(".lora_B." in k and t.abs().sum() > 0 for k, t in a.items())
    assert (
        json.loads((run / "train_config.json").read_text())["train"]["options"]["lora_base"]
        == scheme
    )


def test_lora_needs_a_base_and_a_changed_base_is_refused(base, tmp_path, capsys):
    args = ["train", "--data", str(base / "corpus.txt"), "--lora", "--max-steps", "1"]
    assert main([*args, "--out", str(tmp_path / "x")]) == 2
    assert "--lora trains adapters on a pretrained model" in capsys.readouterr().err
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    args = ["train", "--init-from", str(copy / "base"), "--data", str(copy / "corpus.txt")]
    assert main([*args, "--lora", "--max-steps", "1", "--out", str(tmp_path / "run")]) == 0
    weights = copy / "base" / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-1] ^= 1
    weights.write_bytes(bytes(blob))
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "run"), "--max-steps", "2"]) == 2
    assert "trained on another base" in capsys.readouterr().err
    assert main(["sample", str(tmp_path / "run"), "--prompt", "F"]) == 2
    assert "changed since the adapters were trained" in capsys.readouterr().err


def test_a_run_saved_with_the_older_base_hash_resumes(base, tmp_path, capsys):
    from lamina.interop.origin import Origin

    assert _train(base, tmp_path / "run", "--max-steps", "1") == 0
    files = json.loads((tmp_path / "run" / "train_config.json").read_text())["init_from"]["files"]
    older = Origin("model", base / "base", tuple(map(Path, files))).legacy_hash  # names + bytes
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    (tmp_path / "run" / "config.json").write_text(
        json.dumps(config | {"base": config["base"] | {"sha256": older}})
    )
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "run"), "--max-steps", "2", "--quiet"]) == 0
    config["base"]["sha256"] = "0" * 64  # neither hash: refused, saying what to do
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    assert main(["train", "--resume", str(tmp_path / "run"), "--max-steps", "3"]) == 2
    assert "resume with the base it was trained on" in capsys.readouterr().err


def test_memory_fit_counts_lora_as_lora():
    config = GPTConfig.preset("smollm-135m")
    full, lora = fit_bytes(config), fit_bytes(config, LoRAConfig())
    assert full == 16 * count_params(config) and lora < full / 3


def test_sft_task_trains_on_chats_with_the_prompt_masked(base, tmp_path, capsys):
    chats = tmp_path / "chats.jsonl"
    rows = [{"prompt": f"{n}?", "completion": "yes" if n % 2 else "no"} for n in range(60)]
    chats.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    args = ["train", "--task", "sft", "--init-from", str(base / "base"), "--data", str(chats)]
    args += ["--lora", "--max-steps", "3", "--batch-size", "4", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "sft")]) == 0
    said = capsys.readouterr().out
    assert (
        "sft" in json.loads((tmp_path / "sft" / "train_config.json").read_text())["train"]["task"]
    )
    assert "done at step 3" in said
    assert (tmp_path / "sft" / "adapters.safetensors").is_file()


def test_sft_evaluates_on_a_held_out_file_on_assistant_tokens_only(base, tmp_path, capsys):
    """--val-data (same formats as --data) is what an SFT run evaluates: all of --data trains,
    and the held-out loss counts exactly the completion tokens of the held-out file."""
    chats, held = tmp_path / "chats.jsonl", tmp_path / "held.jsonl"
    rows = [{"prompt": f"{n}?", "completion": "yes" if n % 2 else "no"} for n in range(40)]
    chats.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    held_rows = [{"prompt": f"{n}?", "completion": a} for n, a in ((1, "yes"), (4, "no"))]
    held.write_text("\n".join(json.dumps(r) for r in held_rows), encoding="utf-8")
    args = ["train", "--task", "sft", "--init-from", str(base / "base"), "--data", str(chats)]
    args += ["--lora", "--max-steps", "2", "--batch-size", "4", "--quiet", "--val-data"]
    assert main([*args, str(held), "--out", str(tmp_path / "sft")]) == 0
    capsys.readouterr()
    from lamina.data.instruct import encode_example, parse_record

    tok = lamina.open_model(base / "base").tokenizer
    want = sum(sum(encode_example(tok, parse_record(r, "x"))[1][1:]) for r in held_rows)
    metrics = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["val_target_tokens"] == want
    train = json.loads((tmp_path / "sft" / "train_config.json").read_text())["train"]
    assert train["options"]["val_data"] == str(held)
    assert main([*args[:-1], "--task", "lm", "--val-data", str(held)]) == 2
    assert "applies to --task classify / sft, not lm" in capsys.readouterr().err
