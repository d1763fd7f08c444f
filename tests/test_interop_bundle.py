"""lamina.open: one place picks the reader; the bundle carries model, tokenizer and origin.

Opening builds on the meta device and assigns tensors read into place: a subprocess measures
the resident memory it takes (against the weight bytes), and a patched init shows that no
random weights are drawn. The real model (SmolLM2-135M-Instruct, GGUF) is opened once for the
module: a chat bundle whose `lamina sample` stops at <|im_end|>.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig, LaminaError
from lamina.cli import main
from lamina.data import CharTokenizer
from lamina.generation import generate
from lamina.interop import bundle as bundle_module

TEXT = "ROMEO: But soft, what light through yonder window breaks?\n"
SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A lamina model folder, a run-shaped folder and a Hugging Face Llama folder of one model."""
    d = tmp_path_factory.mktemp("bundle")
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, n_layers=2))
    lamina.save(d / "model", model, tok)
    lamina.save(d / "run", model, tok)
    (d / "run" / "trainer_state.json").write_text(json.dumps({"step": 3}))
    lamina.save_hf(model, d / "hf")
    return d, model.eval()


def test_each_source_kind_opens_to_the_same_model(folders):
    d, model = folders
    ids = torch.randint(
        0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)
    )
    want = model(ids)
    for name, kind in (("model", "model"), ("run", "run"), ("hf", "hf")):
        b = lamina.open(d / name)
        assert b.origin.kind == kind and b.origin.path == (d / name).resolve()
        assert not b.model.training and b.model.config == model.config
        torch.testing.assert_close(b.model(ids), want, atol=0, rtol=0)
    assert lamina.open(d / "model").tokenizer == CharTokenizer.from_text(TEXT)
    assert lamina.open(d / "hf").tokenizer is None  # save_hf carries no char tokenizer


def test_dtype_is_applied_as_the_tensors_are_read(folders):
    for name in ("model", "hf"):
        model = lamina.open(folders[0] / name, dtype=torch.bfloat16).model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_special_ids_and_template_come_from_the_tokenizer(folders):
    """A char tokenizer names no end of turn and no template: empty, None, not a chat model."""
    b = lamina.open(folders[0] / "model")
    assert b.eot_ids == () and b.chat_template is None and not b.is_chat and b.bos_id is None


def test_content_hash_covers_the_weights(folders, tmp_path):
    d, model = folders
    a, again = lamina.open(d / "model").origin, lamina.open(d / "model").origin
    assert a.content_hash == again.content_hash and len(a.content_hash) == 64
    other = GPT(model.config)
    lamina.save(tmp_path / "other", other)
    assert lamina.open(tmp_path / "other").origin.content_hash != a.content_hash


def test_opening_draws_no_random_weights(folders, monkeypatch):
    """Every torch init on a real (non-meta) tensor raises: opening still works."""

    def refuse(name):
        real = getattr(torch.nn.init, name)

        def init(tensor, *args, **kwargs):
            if not tensor.is_meta:
                raise AssertionError(f"random init {name} on a real tensor")
            return real(tensor, *args, **kwargs)

        return init

    for name in ("normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_", "trunc_normal_"):
        monkeypatch.setattr(torch.nn.init, name, refuse(name))
    for name in ("model", "hf"):
        lamina.open(folders[0] / name)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p, "no such model"),
        (lambda p: (p.mkdir(), p)[1], "is not a model: it has no config.json"),
        (lambda p: (p.write_text("hi"), p)[1], "is a file but not a GGUF file"),
        (lambda p: _config(p, {"model_type": "bert"}), "model_type 'bert' is not one lamina runs"),
        (lambda p: _config(p, {"hello": 1}), "neither lamina's"),
    ],
)
def test_what_is_not_a_model_is_one_line(tmp_path, make, message):
    with pytest.raises(LaminaError, match=message):
        lamina.open(make(tmp_path / "x"))


def _config(p: Path, data: dict) -> Path:
    p.mkdir()
    (p / "config.json").write_text(json.dumps(data))
    return p


def test_require_names_what_a_verb_misses(folders):
    b = lamina.open(folders[0] / "hf")
    assert b.require("decoder", tokenizer=False) is b
    with pytest.raises(LaminaError, match="has no tokenizer"):
        b.require("decoder")
    with pytest.raises(LaminaError, match="does not hold a classifier"):
        b.require("classifier")


def test_sample_chat_needs_a_template_and_system_needs_chat(folders, capsys):
    model = str(folders[0] / "model")
    assert main(["sample", model, "--chat", "--prompt", "ROMEO"]) == 2
    assert "has no chat template" in capsys.readouterr().err
    assert main(["sample", model, "--system", "be brief", "--prompt", "ROMEO"]) == 2
    assert "--system needs --chat" in capsys.readouterr().err


# Peak from VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across fork + exec, so a
# child of this (large) pytest process would start with pytest's own peak. One fresh process
# per folder (memory freed by one open would be reused by the next), started together.
RSS_SCRIPT = """
import sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
import gc, torch, lamina
lamina.open(sys.argv[1])  # once for the imports it makes (a fresh clone compiles them too)
gc.collect()
try:  # reset the peak (VmHWM) to what is held now: import-time peaks are not the open's
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
base = status("VmRSS")
b = lamina.open(sys.argv[1])
weights = sum(p.numel() * p.element_size() for p in b.model.parameters())
print((status("VmHWM") - base) / weights)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
def test_opening_takes_about_the_weight_bytes_of_memory(tmp_path):
    """Peak RSS while opening a ~30 MB model, less RSS before, is at most 1.3x its weights:
    a lamina folder, a Hugging Face Llama (fused q/k/v, gate/up) and a GPT-2 (transposes)."""
    torch.manual_seed(0)
    llama = GPT(GPTConfig.preset("llama-tiny", vocab_size=8192, d_model=256, d_ff=704,
                                 n_layers=6, block_size=128))  # fmt: skip
    gpt2 = GPT(GPTConfig(vocab_size=8192, block_size=128, d_model=256, n_heads=4, n_layers=6))
    lamina.save(tmp_path / "lamina", llama)
    lamina.save_hf(llama, tmp_path / "hf-llama")
    lamina.save_hf(gpt2, tmp_path / "hf-gpt2")
    layouts = ["lamina", "hf-llama", "hf-gpt2"]
    env = {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", RSS_SCRIPT, str(tmp_path / n)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for n in layouts
    ]
    ratios = [float(run.communicate(timeout=120)[0]) for run in runs]
    shown = ", ".join(f"{n} {r:.2f}x" for n, r in zip(layouts, ratios, strict=True))
    print(f"\nopening took {shown}")
    assert len(ratios) == 3 and max(ratios) <= 1.3


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    """SmolLM2-135M-Instruct opened once for the module."""
    return lamina.open(smollm2_gguf)


def test_a_gguf_chat_model_opens_as_a_chat_bundle(smollm2, smollm2_gguf):
    b = smollm2
    assert b.origin.kind == "gguf" and b.origin.path == smollm2_gguf.resolve()
    assert b.is_chat and "<|im_start|>" in b.chat_template
    im_end = b.tokenizer.special_tokens["<|im_end|>"]
    assert im_end in b.eot_ids and b.model.config.n_layers == 30


def test_sample_stops_at_the_end_of_its_turn(smollm2, smollm2_gguf, monkeypatch, capsys):
    """A plain prompt that opens an assistant turn: greedy sampling ends at <|im_end|>, well
    before 40 tokens, and prints exactly the reply that `generate` stops at."""
    monkeypatch.setattr(bundle_module, "open_model", lambda *a, **k: smollm2)
    tok = smollm2.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.render_chat_text(messages)
    argv = ["sample", str(smollm2_gguf), "--prompt", prompt, "--max-new-tokens", "40",
            "--temperature", "0"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    ids = generate(smollm2.model, torch.tensor([tok.encode_prompt(prompt)]), 40,
                   stop=list(smollm2.eot_ids))[0].tolist()  # fmt: skip
    reply = ids[len(tok.encode_prompt(prompt)) :]
    assert reply[-1] == tok.special_tokens["<|im_end|>"] and len(reply) < 40
    assert out == prompt + tok.decode(reply[:-1]) + "\n"
    assert "Paris" in out and "<|im_end|>" not in out[len(prompt) :]


def test_sample_chat_wraps_the_prompt_in_the_template(smollm2, smollm2_gguf, monkeypatch, capsys):
    """--chat renders the prompt as a user message and prints only the reply."""
    monkeypatch.setattr(bundle_module, "open_model", lambda *a, **k: smollm2)
    argv = ["sample", str(smollm2_gguf), "--chat", "--prompt", "What is the capital of France?",
            "--max-new-tokens", "40", "--temperature", "0"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Paris" in out and "<|im_start|>" not in out and "What is the capital" not in out
