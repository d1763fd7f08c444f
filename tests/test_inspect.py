"""lamina.inspect: maps from the weights path equal the SDPA forward; tables; head patterns."""

import dataclasses

import pytest
import torch

from lamina import GPT, GPTConfig
from lamina.attention import MultiHeadAttention
from lamina.data import CharTokenizer
from lamina.errors import LaminaError
from lamina.generation import encode_prompt
from lamina.inspect import (
    attention_maps,
    forward_with_maps,
    head_patterns,
    next_token_table,
    pattern_scores,
)

TEXT = "ROMEO: But soft, what light through yonder window breaks?\n"
FIELDS = {f.name for f in dataclasses.fields(GPTConfig)}

# every model option we know of; options this lamina's GPTConfig does not have yet are skipped
OPTIONS = [
    {},
    {"norm_first": False},
    {"activation": "relu", "bias": False, "qkv_bias": False},
    {"positions": "sinusoidal", "tie_weights": False},
    {"positions": "rope"},
    {"n_kv_heads": 2},
    {"norm": "rms"},
    {"activation": "swiglu"},
    {"qk_norm": True},
    {"logit_softcap": 15.0},
]


def tiny(**options) -> GPT:
    missing = set(options) - FIELDS
    if missing:
        pytest.skip(f"GPTConfig has no {', '.join(sorted(missing))} here")
    try:
        config = GPTConfig.preset("tiny", vocab_size=40, block_size=24, init_std=0.2, **options)
    except LaminaError as exc:  # a value this lamina does not offer yet
        pytest.skip(str(exc))
    torch.manual_seed(0)
    return GPT(config).eval()


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
def test_maps_path_equals_the_sdpa_forward(options):
    model = tiny(**options)
    ids = torch.randint(0, 40, (20,), generator=torch.Generator().manual_seed(1))
    outputs: dict[str, list[torch.Tensor]] = {"sdpa": [], "maps": []}
    which = ["sdpa"]
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    hooks = [
        m.register_forward_hook(lambda m, a, o: outputs[which[0]].append(o[0])) for m in layers
    ]
    with torch.no_grad():
        fast = model(ids[None])[0]
    which[0] = "maps"
    logits, maps = forward_with_maps(model, ids)
    for h in hooks:
        h.remove()
    assert all(m.impl == "sdpa" for m in layers)  # the fast path was the one compared against
    torch.testing.assert_close(logits, fast, atol=1e-5, rtol=1e-5)
    assert len(outputs["maps"]) == len(outputs["sdpa"]) == model.config.n_layers
    for a, b in zip(outputs["maps"], outputs["sdpa"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    L, H = model.config.n_layers, model.config.n_heads
    assert maps.shape == (L, H, 20, 20) and maps.dtype == torch.float32
    torch.testing.assert_close(maps.sum(-1), torch.ones(L, H, 20))
    assert float(maps.triu(1).abs().max()) == 0.0  # causal: no query sees a later key
    assert torch.equal(attention_maps(model, ids[None]), maps)
    # no hook is left behind: a plain forward returns no weights
    out, w = layers[0](torch.randn(1, 3, model.config.d_model))
    assert w is None


def test_maps_equal_the_models_own_attention_weights_and_the_mode_is_kept():
    model = tiny().train()
    ids = torch.arange(12) % 40
    maps = attention_maps(model, ids)
    assert model.training and all(m.training for m in model.modules())
    ref = torch.stack([w[0] for w in model.eval().attention_weights(ids[None])])
    torch.testing.assert_close(maps, ref)


def test_next_token_table_rows_match_softmax_of_logits():
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, block_size=64, init_std=0.3))
    text = "ROMEO: what"
    rows = next_token_table(model, tok, encode_prompt(tok, text), k=3)
    assert [r.token for r in rows] == list(text)
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([tok.encode(text)]))[0], -1)
    for t, row in enumerate(rows):
        assert len(row.top) == 3
        ps = [p for _, _, p in row.top]
        assert ps == sorted(ps, reverse=True)
        assert row.top[0][1] == int(probs[t].argmax())
        assert row.top[0][2] == pytest.approx(float(probs[t].max()), abs=1e-6)
        if t + 1 < len(text):
            assert row.actual == text[t + 1]
            assert row.p_actual == pytest.approx(
                float(probs[t, tok.encode(text[t + 1])[0]]), abs=1e-6
            )
        else:
            assert row.actual is None and row.p_actual is None
    d = rows[0].to_dict()
    assert set(d) == {"position", "token", "top", "actual", "p_actual"}


def _map(kind: str, T: int) -> torch.Tensor:
    a = torch.zeros(T, T)
    for i in range(T):
        if kind == "previous":
            a[i, max(i - 1, 0)] = 1
        elif kind == "first":
            a[i, 0] = 1
        elif kind == "own":
            a[i, i] = 1
        else:
            a[i, : i + 1] = 1 / (i + 1)
    return a


def test_head_patterns_name_synthetic_heads():
    T = 10
    maps = torch.stack([_map(k, T) for k in ("previous", "first", "own", "uniform")])[None]
    names = [p.name for p in head_patterns(maps)[0]]
    assert names == ["previous token", "first token", "own position", "broad"]
    assert head_patterns(maps)[0][0].score == pytest.approx(1.0)
    # same token: each query attends to the latest earlier copy of its own token
    ids = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
    a = torch.zeros(T, T)
    for i in range(T):
        a[i, i - 3 if i >= 3 else i] = 1
    assert head_patterns(a[None, None], ids)[0][0].name == "same token"
    assert pattern_scores(a, ids)["same token"] == pytest.approx(1.0)
    # induction: attends to the token after the earlier copy
    b = torch.zeros(T, T)
    for i in range(T):
        b[i, i - 2 if i >= 3 else i] = 1
    assert head_patterns(b[None, None], ids)[0][0].name == "induction"


def test_a_diffuse_head_that_fits_nothing_is_mixed():
    T = 40
    a = torch.zeros(T, T)
    for i in range(T):  # far back, split over two keys that move with the query
        if i < 11:
            a[i, i] = 1
        else:
            a[i, i - 10] = a[i, i - 11] = 0.5
    p = head_patterns(a[None, None])[0][0]
    assert p.name == "mixed" and p.score < 0.3


def test_fixed_key_and_line_start_heads_are_named_with_their_key():
    tokens = list("ab,cdefg\nhijklmnop")
    T = len(tokens)
    fixed, line = torch.zeros(T, T), torch.zeros(T, T)
    for i in range(T):
        fixed[i, 2 if i > 2 else i] = 1  # every later query looks at the comma
        line[i, 9 if i > 9 else i] = 1  # ... at the first token after the newline
    patterns = head_patterns(torch.stack([fixed, line])[None], tokens=tokens)[0]
    assert patterns[0].name == "fixed key" and "',' at 2" in patterns[0].caption()
    assert patterns[1].scores["line start"] == pytest.approx(1.0)
    assert patterns[1].name == "line start"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("ROMEO Z", "'Z' at position 6"),
        ("x" * 70, "block_size 64"),
    ],
)
def test_bad_text_is_a_named_error(text, message):
    tok = CharTokenizer.from_text(TEXT + "x")
    with pytest.raises(LaminaError, match=message):
        encode_prompt(tok, text, block_size=64, empty="error", what="text")


def test_bad_maps_and_ids_are_errors():
    with pytest.raises(LaminaError, match="maps must be"):
        head_patterns(torch.zeros(2, 3, 4))
    with pytest.raises(LaminaError, match="ids has 3"):
        head_patterns(torch.zeros(1, 1, 4, 4), [1, 2, 3])
    with pytest.raises(LaminaError, match=r"in \[0, 40\)"):
        attention_maps(tiny(), [1, 2, 99])
    with pytest.raises(LaminaError, match="block_size"):
        attention_maps(tiny(), list(range(30)))
    with pytest.raises(LaminaError, match="k must be"):
        next_token_table(tiny(), CharTokenizer.from_text(TEXT), [1, 2], k=0)
