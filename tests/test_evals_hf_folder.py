"""A Hugging Face folder saved by transformers, scored as lm-eval scores it (issue 30.7).

The folder is what transformers writes from a GGUF (tests/real_model.save_smollm2_hf): its tied
matrix stored once, under `lm_head.weight`. lamina opens it as transformers does, and its
multiple-choice log-likelihoods on a task of the issue's shape (two lines of context, four next
lines each starting with a newline, target_delimiter "") equal transformers' own, computed the
way lm-eval's hf backend computes them (context + continuation encoded whole, then split).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_model

import lamina


def test_a_tied_head_stored_under_lm_head_only_is_the_embedding(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    hf = transformers.LlamaForCausalLM(cfg).eval()
    (tmp_path / "config.json").write_text(cfg.to_json_string())
    save_model(hf, str(tmp_path / "model.safetensors"))  # keeps one name: lm_head.weight
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "model.embed_tokens.weight" not in f.keys() and "lm_head.weight" in f.keys()
    model = lamina.open(tmp_path).model
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        assert torch.allclose(model(ids), hf(ids).logits, atol=1e-5)


ITEMS = 4  # of next-line-2 (16 choices): a few seconds for both models on SmolLM2-135M


def transformers_logliks(hf: object, tok: object, context: str, continuation: str) -> float:
    """lm-eval's hf backend, written out: context + continuation encoded whole (the tokenizer's
    own special tokens, as `add_bos_token=None` leaves them), the continuation the tokens after
    the context's own encoding, their log-probabilities summed."""
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    cont = whole[len(ctx) :]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(hf(ids).logits[0].float(), dim=-1)
    return float(logp[-len(cont) - 1 : -1].gather(1, torch.tensor(cont)[:, None]).sum())


@pytest.fixture(scope="module")
def folder_models(smollm2_hf):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(smollm2_hf, dtype=torch.float32)
    return (
        lamina.open(smollm2_hf),
        hf.eval(),
        transformers.AutoTokenizer.from_pretrained(smollm2_hf),
    )


def test_choice_logliks_on_a_saved_folder_equal_transformers(folder_models):
    from lamina.evals.builtin_tasks import builtin_task
    from lamina.evals.choice import encode_pair, score_items

    bundle, hf, tok = folder_models
    task = builtin_task("next-line-2", ITEMS)
    assert task.delimiter == "" and all(c.startswith("\n") for i in task.items for c in i.choices)
    scores = score_items(bundle.model, bundle.tokenizer, task.items, delimiter=task.delimiter)
    worst = 0.0
    for item, got in zip(task.items, scores, strict=True):
        for choice, ll in zip(item.choices, got.logliks, strict=True):
            ctx, cont = encode_pair(bundle.tokenizer, item.context, choice)
            assert ctx == tok.encode(item.context)  # the same ids, no BOS on either side
            assert ctx + cont == tok.encode(item.context + choice)
            worst = max(worst, abs(ll - transformers_logliks(hf, tok, item.context, choice)))
    assert worst < 1e-3, worst
