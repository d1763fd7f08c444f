"""Generation, decoder: KV cache == full recompute, the window rule past block_size, misuse."""

import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError
from lamina.generation import Decoder, default_keep, generate, slide


def model_for(seed: int = 0, **kw) -> GPT:
    """A tiny model with spread-out logits (init_std 0.1), so greedy ties do not happen."""
    torch.manual_seed(seed)
    kw = {"block_size": 16, "init_std": 0.1, **kw}
    return GPT(GPTConfig.preset("tiny", **kw)).eval()


# every layer option, one at a time and all together (llama-like)
MODERN = [
    {"positions": "rope"},
    {"norm": "rms", "norm_gain": False},
    {"activation": "swiglu", "d_ff": 24},
    {"activation": "relu2"},
    {"n_kv_heads": 1},
    {"n_kv_heads": 2, "qk_norm": True},
    {"logit_softcap": 3.0},
    {"positions": "rope", "norm": "rms", "activation": "swiglu", "n_kv_heads": 2, "bias": False},
]


def recompute_last(model: GPT, ids: torch.Tensor, start: int) -> torch.Tensor:
    """Logits for the next token of a single row, from scratch over ids[start:]: (1, V)."""
    return model(ids[None, start:])[:, -1]


def test_slide_keeps_windows_within_block_size():
    """The rule jumps a full window forward to its newest `keep` tokens, and only then."""
    assert slide([0, 3], 16, 16, 12) == [0, 3]
    assert slide([0, 3], 17, 16, 12) == [5, 3]
    assert slide([5, 3], 20, 16, 12) == [5, 8]
    assert default_keep(16) == 12 and default_keep(1) == 1


@pytest.mark.parametrize(
    "kw, fixed",
    [({}, False), ({}, True), ({"norm_first": False}, False), ({"positions": "sinusoidal"}, True)]
    + [(kw, False) for kw in MODERN]
    + [(MODERN[-1], True)],
)
def test_cached_logits_equal_full_recompute_at_every_step(kw, fixed):
    """Prefill and every decode step, through two window jumps, match recomputing the window."""
    model = model_for(**kw)
    block = model.config.block_size
    torch.manual_seed(1)
    prompt = torch.randint(0, 100, (1, 5))
    dec = Decoder(model, prompt, [0], 5 + 40, fixed_shape=fixed)
    seq, start = prompt[0].tolist(), 0
    with torch.no_grad():
        logits = dec.prefill()
        for _ in range(40):
            ref = recompute_last(model, torch.tensor(seq), start)
            torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)
            token = int(logits.argmax())
            seq.append(token)
            if len(seq) - start > block:
                start = len(seq) - default_keep(block)
            logits = dec.decode(torch.tensor([token]))
    assert start > 0, "the test should cross block_size"


@pytest.mark.parametrize("fixed", [False, True])
def test_cached_logits_equal_recompute_for_a_left_padded_batch(fixed):
    """Rows of different lengths, windows jumping at different steps, each equals its own."""
    model = model_for()
    block, keep = model.config.block_size, default_keep(model.config.block_size)
    torch.manual_seed(2)
    rows = [torch.randint(0, 100, (n,)).tolist() for n in (7, 2, 4)]
    T = 7
    ids = torch.tensor([[0] * (T - len(r)) + r for r in rows])
    dec = Decoder(model, ids, [T - len(r) for r in rows], T + 30, fixed_shape=fixed)
    starts = [0, 0, 0]
    with torch.no_grad():
        logits = dec.prefill()
        for _ in range(30):
            for i, r in enumerate(rows):
                ref = recompute_last(model, torch.tensor(r), starts[i])
                torch.testing.assert_close(logits[i : i + 1], ref, rtol=1e-5, atol=1e-5)
            tokens = logits.argmax(-1)
            for i, r in enumerate(rows):
                r.append(int(tokens[i]))
                if len(r) - starts[i] > block:
                    starts[i] = len(r) - keep
            logits = dec.decode(tokens)
    assert len({s for s in starts}) > 1, "rows should jump at different steps"


@pytest.mark.parametrize("keep, fixed", [(None, False), (None, True), (1, False), (9, True)])
def test_greedy_with_cache_equals_without_for_300_tokens_past_block_size(keep, fixed):
    """Token for token, both paths following the one window rule."""
    model = model_for(block_size=24)
    torch.manual_seed(3)
    prompt = torch.randint(0, 100, (1, 6))
    cached = generate(model, prompt, 300, window_keep=keep, fixed_shape=fixed)
    uncached = generate(model, prompt, 300, window_keep=keep, use_cache=False)
    assert cached.shape == (1, 306)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("kw", [{}, MODERN[0], MODERN[-1], {"n_kv_heads": 1, "qk_norm": True}])
def test_batched_greedy_with_cache_equals_without_past_block_size(kw):
    model = model_for(block_size=24, **kw)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [42], [1, 2, 3, 4]]
    uncached = generate(model, prompts, 100, use_cache=False)
    assert torch.equal(generate(model, prompts, 100), uncached)
    assert torch.equal(generate(model, prompts, 100, fixed_shape=True), uncached)


def test_keep_block_size_is_the_crop_rule_of_gpt_greedy():
    """window_keep=block_size slides one token per step, as GPT.greedy crops."""
    model = model_for()
    prompt = torch.randint(0, 100, (2, 20))  # longer than block_size too
    out = generate(model, prompt, 40, window_keep=model.config.block_size)
    assert torch.equal(out, model.greedy(prompt, 40))


def test_within_block_size_generate_equals_gpt_greedy():
    model = model_for(block_size=32)
    prompt = torch.randint(0, 100, (3, 4))
    assert torch.equal(generate(model, prompt, 28), model.greedy(prompt, 28))


def test_a_long_prompt_is_cropped_to_its_last_block_size_tokens():
    model = model_for()
    prompt = torch.randint(0, 100, (1, 40))
    out = generate(model, prompt, 1)
    assert out[0, -1] == model(prompt[:, -16:])[0, -1].argmax()


def test_decode_before_prefill_is_an_error():
    dec = Decoder(model_for(), torch.zeros(1, 3, dtype=torch.long), [0], 10)
    with pytest.raises(LaminaError, match="before prefill"):
        dec.decode(torch.tensor([1]))


def test_prefill_twice_is_an_error():
    dec = Decoder(model_for(), torch.zeros(1, 3, dtype=torch.long), [0], 10)
    with torch.no_grad():
        dec.prefill()
    with pytest.raises(LaminaError, match="already"):
        dec.prefill()


def test_decoding_past_capacity_is_an_error():
    dec = Decoder(model_for(), torch.zeros(1, 3, dtype=torch.long), [0], 4)
    with torch.no_grad():
        dec.prefill()
        dec.decode(torch.tensor([1]))
        with pytest.raises(LaminaError, match="full"):
            dec.decode(torch.tensor([1]))


def test_batch_larger_than_the_cache_is_an_error():
    model = model_for()
    caches = model.make_caches(1)
    with pytest.raises(LaminaError, match="larger than the KV cache"):
        model(torch.zeros(2, 3, dtype=torch.long), caches=caches)


def test_bad_window_keep_is_an_error_naming_it():
    with pytest.raises(LaminaError, match="window_keep.*17"):
        generate(model_for(), torch.zeros(1, 3, dtype=torch.long), 2, window_keep=17)


def test_bf16_caches_and_weights_run_and_mostly_agree():
    """bf16 is an option (speed); fp32 is what the contracts hold exactly."""
    model = model_for(block_size=32)
    prompt = torch.randint(0, 100, (1, 4))
    ref = generate(model, prompt, 8)
    out = generate(model.to(torch.bfloat16), prompt, 8)
    assert out.shape == ref.shape and out.dtype == torch.long
    assert torch.equal(out[:, :5], ref[:, :5])
