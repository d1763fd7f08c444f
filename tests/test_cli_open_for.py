"""One way a verb opens a model (issue 34.2): `lamina.cli.open_for` opens, requires the kind,
checks the weights are finite, and every verb that takes a model goes through it."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
import torch

import lamina
from lamina import GPT, GPTConfig
from lamina.cli import main, open_for
from lamina.errors import LaminaError
from lamina.models.config import EncoderConfig
from lamina.models.encoder import SequenceClassifier
from lamina.tokenizers.kinds import CharTokenizer

CLI = Path(lamina.__file__).parent / "cli"
TOK = CharTokenizer.from_text("abchi \n")


def _gpt(nan: bool) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=TOK.vocab_size, block_size=16, d_model=16, n_heads=2, n_layers=1)
    model = GPT(cfg)
    if nan:
        with torch.no_grad():
            model.blocks[0].attn.proj.weight[0, 0] = math.nan
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    cfg = EncoderConfig(vocab_size=TOK.vocab_size + 2, max_len=8, d_model=16, n_heads=2,
                        n_layers=1, d_ff=32)  # fmt: skip
    torch.manual_seed(0)
    classifier = SequenceClassifier(cfg, 2)
    classifier.labels = ["no", "yes"]
    return {
        "gpt": lamina.save(d / "gpt", _gpt(False), TOK),
        "nan": lamina.save(d / "nan", _gpt(True), TOK),
        "bare": lamina.save(d / "bare", _gpt(False)),
        "cls": lamina.save(d / "cls", classifier, TOK),
    }


def test_open_for_opens_requires_and_checks(models):
    bundle = open_for(models["gpt"], "sample")
    assert isinstance(bundle.model, GPT) and bundle.tokenizer is not None
    with pytest.raises(LaminaError, match=r"not a decoder \(GPT\): lamina sample needs one"):
        open_for(models["cls"], "sample")
    with pytest.raises(LaminaError, match="does not hold a classifier"):
        open_for(models["gpt"], "predict", "classifier")
    assert isinstance(open_for(models["cls"], "eval", "model").model, SequenceClassifier)
    with pytest.raises(LaminaError, match="has no tokenizer"):
        open_for(models["bare"], "sample")
    assert open_for(models["bare"], "quantize", tokenizer=False).tokenizer is None
    with pytest.raises(LaminaError, match=r"not finite \(NaN or infinity in blocks\.0\.attn"):
        open_for(models["nan"], "quantize", tokenizer=False)


def _argv(verb: str, model: Path, tmp: Path) -> list[str]:
    out = str(tmp / f"out-{verb}")
    return {
        "sample": ["sample", str(model), "--max-new-tokens", "2", "--prompt", "hi"],
        "chat": ["chat", str(model)],
        "attention": ["attention", str(model), "--text", "hi", "--out", out + ".png"],
        "eval": ["eval", str(model), "--data", str(tmp / "c.txt")],
        "quantize": ["quantize", str(model), "--to", "int8", "--out", out],
        "convert-hf": ["convert", "--to", "hf", str(model), "--out", out],
        "convert-gguf": ["convert", "--to", "gguf", str(model), "--out", out + ".gguf"],
        "serve": ["serve", str(model), "--port", "0"],
    }[verb]


VERBS = ["sample", "chat", "attention", "eval", "quantize", "convert-hf", "convert-gguf", "serve"]


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_refuses_non_finite_weights_in_one_line(verb, models, tmp_path, capsys):
    if verb == "serve":
        pytest.importorskip("starlette")
        pytest.importorskip("uvicorn")
    (tmp_path / "c.txt").write_text("abc hi\n" * 50)
    assert main(_argv(verb, models["nan"], tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    assert "not finite" in err and "blocks.0.attn.proj.weight" in err
    assert not list(tmp_path.glob("out-*")), "nothing is written for a refused model"


@pytest.mark.parametrize("verb", [v for v in VERBS if v != "eval"])
def test_every_decoder_verb_refuses_a_classifier_naming_itself(verb, models, tmp_path, capsys):
    if verb == "serve":
        pytest.importorskip("starlette")
        pytest.importorskip("uvicorn")
    assert main(_argv(verb, models["cls"], tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    name = verb.split("-")[0]
    assert f"not a decoder (GPT): lamina {name} needs one" in err, err


def test_no_verb_opens_a_model_another_way():
    """Only open_for (in cli/__init__.py) calls the model openers."""
    openers = {"open_model", "load_model", "from_hf", "load_gguf", "load_hf_gpt2", "load_hf_llama"}
    for path in sorted(CLI.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                owner = getattr(getattr(f, "value", None), "id", None)
                api = owner == "lamina" and name in ("open", "load")  # lamina.open / lamina.load
                assert name not in openers and not api, f"{path.name}:{node.lineno} calls {name}"
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {a.name for a in node.names}
                assert not names & {"open_model", "load_model"}, f"{path.name} imports an opener"


def test_eval_scores_dequantized_weights_unless_told():
    """Scores are held to fp32 references (lm-eval's hf backend dequantizes a GGUF): lamina eval
    opens float weights by default; the verbs that only run a model keep lamina.open's choice."""
    from lamina.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["eval", "m.gguf"]).keep_quantized is False
    assert parser.parse_args(["eval", "m.gguf", "--keep-quantized"]).keep_quantized is True
    assert parser.parse_args(["sample", "m.gguf"]).keep_quantized is None
