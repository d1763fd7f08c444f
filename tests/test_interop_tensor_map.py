"""The one tensor table (lamina.interop.tensor_map) against the HF converters' own name lists,
its checker's one-line refusals, and its transforms in both directions."""

from __future__ import annotations

import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError
from lamina.interop import tensor_map
from lamina.interop.hf_gpt2 import layer_names
from lamina.interop.hf_llama import tensor_groups


def _shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        model = GPT(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tie", [True, False])
def test_hf_gpt2_column_is_the_gpt2_converters_names(tie):
    config = GPTConfig.preset("tiny", tie_weights=tie)
    rows = tensor_map.rows(config, _shapes(config), "hf-gpt2")
    ours = {
        (r.lamina, r.parts[0].foreign, r.parts[0].transform is tensor_map.TRANSPOSE) for r in rows
    }
    assert all(len(r.parts) == 1 for r in rows)
    assert ours == set(layer_names(config))


@pytest.mark.parametrize(
    "extra", [{}, {"tie_weights": True}, {"qkv_bias": True, "bias": True}], ids=str
)
def test_hf_llama_column_is_the_llama_converters_names(extra):
    config = GPTConfig.preset("llama-tiny", **extra)
    rows = tensor_map.rows(config, _shapes(config), "hf-llama")
    assert {(r.lamina, tuple(p.foreign for p in r.parts)) for r in rows} == {
        (name, tuple(parts)) for name, parts in tensor_groups(config)
    }
    qkv = next(r for r in rows if r.lamina == "blocks.0.attn.qkv.weight")
    assert [p.rows for p in qkv.parts] == [128, 64, 64]  # 4 heads of 32, 2 kv heads


def test_checker_names_missing_unexpected_and_shapes():
    config = GPTConfig.preset("llama-tiny", n_layers=1)
    rows = tensor_map.rows(config, _shapes(config), "gguf-llama", permute_rope=True)
    good = {p.foreign: s for r in rows for p, s in zip(r.parts, r.foreign_shapes(), strict=True)}
    tensor_map.check(rows, good, "f.gguf", "metadata")
    bad = {k: v for k, v in good.items() if k != "blk.0.ffn_up.weight"} | {"x\nweird": (1,)}
    with pytest.raises(LaminaError, match=r"f.gguf does not match its metadata: missing "
                       r"blk.0.ffn_up.weight; unexpected 'x\\nweird'"):  # fmt: skip
        tensor_map.check(rows, bad, "f.gguf", "metadata")
    with pytest.raises(LaminaError, match=r"output.weight has shape \(3, 3\), metadata implies"):
        tensor_map.check(rows, {**good, "output.weight": (3, 3)}, "f.gguf", "metadata")
    with pytest.raises(LaminaError, match="embed.wpe.weight has no counterpart in the gguf-llama"):
        gpt2 = GPTConfig.preset("tiny")
        tensor_map.rows(gpt2, _shapes(gpt2), "gguf-llama")


def test_to_foreign_then_to_lamina_is_the_identity():
    config = GPTConfig.preset("llama-tiny", n_layers=1, qkv_bias=True, bias=True)
    torch.manual_seed(0)
    state = {k: torch.randn(v) for k, v in _shapes(config).items()}
    for fmt, permute in [("hf-llama", False), ("gguf-llama", True)]:
        rows = tensor_map.rows(config, _shapes(config), fmt, permute_rope=permute)
        foreign = tensor_map.to_foreign(rows, state)
        back = tensor_map.to_lamina(rows, foreign.__getitem__)
        assert back.keys() == {r.lamina for r in rows}
        assert all(torch.equal(back[k], state[k]) for k in back)
    gguf = tensor_map.to_foreign(
        tensor_map.rows(config, _shapes(config), "gguf-llama", permute_rope=True), state
    )
    hf = tensor_map.to_foreign(tensor_map.rows(config, _shapes(config), "hf-llama"), state)
    assert not torch.equal(
        gguf["blk.0.attn_q.weight"], hf["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(gguf["blk.0.attn_v.weight"], hf["model.layers.0.self_attn.v_proj.weight"])
