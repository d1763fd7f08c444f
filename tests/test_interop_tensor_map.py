"""The tensor mechanism (lamina.interop.tensor_map) over the family records: rows from a
record's table, the checker's one-line refusals, and the transforms in both directions."""

from __future__ import annotations

import pytest
import torch

from lamina import GPTConfig, LaminaError
from lamina.interop import tensor_map
from lamina.interop.families import FAMILIES

LLAMA, GPT2 = FAMILIES["llama"], FAMILIES["gpt2"]
_shapes = tensor_map.lamina_shapes


@pytest.mark.parametrize("tie", [True, False])
def test_gpt2_rows_transpose_the_conv1d_weights(tie):
    config = GPTConfig.preset("tiny", tie_weights=tie)
    rows = tensor_map.rows(config, _shapes(config), GPT2, "hf")
    assert all(len(r.parts) == 1 for r in rows)
    assert ("head.weight" in {r.lamina for r in rows}) == (not tie)
    transposed = {r.lamina for r in rows if r.parts[0].transform is tensor_map.TRANSPOSE}
    assert transposed == {f"blocks.{i}.{n}.weight" for i in range(2)
                          for n in ("attn.qkv", "attn.proj", "ff.fc", "ff.proj")}  # fmt: skip
    assert rows[0].parts[0].foreign.startswith("transformer.")


def test_llama_rows_split_the_fused_tensors():
    config = GPTConfig.preset("llama-tiny")
    rows = tensor_map.rows(config, _shapes(config), LLAMA, "hf")
    qkv = next(r for r in rows if r.lamina == "blocks.0.attn.qkv.weight")
    assert [p.rows for p in qkv.parts] == [128, 64, 64]  # 4 heads of 32, 2 kv heads
    assert [p.foreign for p in qkv.parts] == [
        f"model.layers.0.self_attn.{x}_proj.weight" for x in "qkv"
    ]
    fc = next(r for r in rows if r.lamina == "blocks.3.ff.fc.weight")
    assert [p.foreign for p in fc.parts] == [
        "model.layers.3.mlp.gate_proj.weight", "model.layers.3.mlp.up_proj.weight"
    ]  # fmt: skip


def test_checker_names_missing_unexpected_and_shapes():
    config = GPTConfig.preset("llama-tiny", n_layers=1)
    rows = tensor_map.rows(config, _shapes(config), LLAMA, "gguf")
    good = {p.foreign: s for r in rows for p, s in zip(r.parts, r.foreign_shapes(), strict=True)}
    tensor_map.check(rows, good, "f.gguf", "metadata")
    bad = {k: v for k, v in good.items() if k != "blk.0.ffn_up.weight"} | {"x\nweird": (1,)}
    with pytest.raises(LaminaError, match=r"f.gguf does not match its metadata: missing "
                       r"blk.0.ffn_up.weight; unexpected 'x\\nweird'"):  # fmt: skip
        tensor_map.check(rows, bad, "f.gguf", "metadata")
    with pytest.raises(LaminaError, match=r"output.weight has shape \(3, 3\), metadata implies"):
        tensor_map.check(rows, {**good, "output.weight": (3, 3)}, "f.gguf", "metadata")
    with pytest.raises(LaminaError, match="embed.wpe.weight has no counterpart in the Llama gguf"):
        gpt2 = GPTConfig.preset("tiny")
        tensor_map.rows(gpt2, _shapes(gpt2), LLAMA, "gguf")


def test_to_foreign_then_to_lamina_is_the_identity():
    config = GPTConfig.preset("llama-tiny", n_layers=1, qkv_bias=True, bias=True)
    torch.manual_seed(0)
    state = {k: torch.randn(v) for k, v in _shapes(config).items()}
    for fmt in ("hf", "gguf"):
        rows = tensor_map.rows(config, _shapes(config), LLAMA, fmt)
        foreign = tensor_map.to_foreign(rows, state)
        back = tensor_map.to_lamina(rows, foreign.__getitem__)
        assert back.keys() == {r.lamina for r in rows}
        assert all(torch.equal(back[k], state[k]) for k in back)
    gguf = tensor_map.to_foreign(tensor_map.rows(config, _shapes(config), LLAMA, "gguf"), state)
    hf = tensor_map.to_foreign(tensor_map.rows(config, _shapes(config), LLAMA, "hf"), state)
    assert not torch.equal(
        gguf["blk.0.attn_q.weight"], hf["model.layers.0.self_attn.q_proj.weight"]
    )
    assert torch.equal(gguf["blk.0.attn_v.weight"], hf["model.layers.0.self_attn.v_proj.weight"])
