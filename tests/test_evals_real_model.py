"""The real model (SmolLM2-135M-Instruct, Q4_1 GGUF): `lamina eval FILE.gguf --task NAME`
prints acc and acc_norm. (Agreement with lm-eval on this model, item for item, is
bench/eval_parity.py --model smollm2: transformers takes minutes to read the GGUF here.)"""

from __future__ import annotations

import json

from lamina.cli import main
from lamina.evals.choice import ChoiceItem, score_items
from lamina.interop.bundle import open_model


def test_eval_a_gguf_file_on_a_builtin_task(smollm2_gguf, capsys):
    args = ["eval", str(smollm2_gguf), "--task", "which-play", "--limit", "2", "--json"]
    assert main(args) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["items"] == 2 and r["chance"] == 0.25 and {"acc", "acc_norm"} <= set(r)


def test_the_real_model_knows_the_capital_of_france(smollm2_gguf):
    bundle = open_model(smollm2_gguf)
    item = ChoiceItem("The capital of France is", ("Paris", "London", "a banana"), 0)
    (s,) = score_items(bundle.model, bundle.tokenizer, [item])
    assert s.pred == 0 and s.pred_norm == 0
    assert s.logliks[0] > s.logliks[1] + 1.0
