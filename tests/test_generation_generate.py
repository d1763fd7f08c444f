"""Generation, public API: generate and stream; batches, stops, seeds, modes and bad input."""

import pytest
import torch

from lamina import GPT, GPTConfig, LaminaError
from lamina.data import CharTokenizer
from lamina.generation import Step, generate, stream


def model_for(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    kw = {"block_size": 16, "init_std": 0.1, **kw}
    return GPT(GPTConfig.preset("tiny", **kw)).eval()


def test_prompt_is_preserved_and_max_new_tokens_respected():
    model = model_for()
    prompt = torch.randint(0, 100, (2, 5))
    out = generate(model, prompt, 7, temperature=1.0, seed=0)
    assert out.shape == (2, 12) and out.dtype == torch.long
    assert torch.equal(out[:, :5], prompt)
    assert torch.equal(generate(model, prompt, 0), prompt)


def test_top_k_1_equals_greedy():
    model = model_for()
    prompt = torch.randint(0, 100, (2, 5))
    sampled = generate(model, prompt, 30, temperature=1.5, top_k=1, seed=3)
    assert torch.equal(sampled, generate(model, prompt, 30))


def test_same_seed_same_tokens_other_seed_other_tokens():
    model = model_for()
    prompt = torch.randint(0, 100, (1, 3))
    a = generate(model, prompt, 40, temperature=1.0, top_p=0.95, seed=11)
    b = generate(model, prompt, 40, temperature=1.0, top_p=0.95, seed=11)
    c = generate(model, prompt, 40, temperature=1.0, top_p=0.95, seed=12)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_batched_prompts_of_different_lengths_equal_one_by_one():
    """Left padding with positions from the mask: each row as if alone, also past block_size."""
    model = model_for()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [42], [1, 2, 3, 4]]
    out = generate(model, prompts, 40, pad_id=0)
    assert out.shape == (3, 7 + 40)
    for i, p in enumerate(prompts):
        alone = generate(model, torch.tensor([p]), 40)
        assert torch.equal(out[i, 7 - len(p) :], alone[0]), f"row {i}"
        assert (out[i, : 7 - len(p)] == 0).all()


def test_an_attention_mask_gives_the_same_as_a_list_of_prompts():
    model = model_for()
    ids = torch.tensor([[9, 9, 3, 4], [1, 2, 3, 4]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = generate(model, ids, 10, attention_mask=mask, pad_id=9)
    assert torch.equal(out, generate(model, [[3, 4], [1, 2, 3, 4]], 10, pad_id=9))


def test_right_padding_is_rejected():
    with pytest.raises(LaminaError, match="left padding"):
        generate(
            model_for(),
            torch.ones(1, 3, dtype=torch.long),
            2,
            attention_mask=torch.tensor([[1, 1, 0]]),
        )


def test_model_is_left_in_the_mode_it_was_in():
    model = model_for(dropout=0.1)
    prompt = torch.randint(0, 100, (1, 3))
    model.train()
    a = generate(model, prompt, 10)
    assert model.training
    assert torch.equal(a, generate(model.eval(), prompt, 10)), "dropout was active"
    assert not model.training


def test_mode_is_restored_after_an_error_and_when_a_stream_is_closed():
    model = model_for().train()
    with pytest.raises(LaminaError):
        generate(model, torch.tensor([[1, 2]]), 3, stop="x")  # strings need a tokenizer
    assert model.training
    steps = stream(model, torch.tensor([[1, 2]]), 5)
    next(steps)
    assert not model.training
    steps.close()
    assert model.training


def test_stream_yields_the_tokens_generate_returns():
    model = model_for()
    prompt = torch.randint(0, 100, (2, 4))
    steps = list(stream(model, prompt, 12, temperature=0.9, seed=5))
    assert all(isinstance(s, Step) and s.tokens.shape == (2,) for s in steps)
    out = generate(model, prompt, 12, temperature=0.9, seed=5)
    assert torch.equal(torch.stack([s.tokens for s in steps], 1), out[:, 4:])
    seen = []
    generate(model, prompt, 12, callback=seen.append)
    assert len(seen) == 12


def test_a_row_ends_at_its_first_stop_token_and_is_padded_after():
    model = model_for()
    prompt = torch.tensor([[3, 1, 4], [1, 5, 9]])
    free = generate(model, prompt, 20)
    stop_id = int(free[0, 3 + 4])  # row 0's fifth new token
    out = generate(model, prompt, 20, stop=stop_id, pad_id=99)
    first = (free[0, 3:] == stop_id).nonzero()[0, 0].item()
    assert torch.equal(out[0, : 3 + first + 1], free[0, : 3 + first + 1]), "stop token kept"
    assert (out[0, 3 + first + 1 :] == 99).all()


def test_generation_ends_when_every_row_has_stopped():
    model = model_for()
    prompt = torch.tensor([[3, 1, 4]])
    free = generate(model, prompt, 20)
    out = generate(model, prompt, 20, stop=[int(free[0, 5])])
    assert out.shape[1] <= 6
    assert out[0, -1] == free[0, 5]


def test_stop_strings_need_a_tokenizer_and_end_the_row():
    tok = CharTokenizer.from_text("abcdefghij klmnopqrstuvwxyz\n")
    model = model_for(vocab_size=tok.vocab_size)
    prompt = torch.tensor([tok.encode("hello")])
    free = tok.decode(generate(model, prompt, 30)[0, 5:])
    stop = free[6:8]
    out = generate(model, prompt, 30, stop=stop, tokenizer=tok, pad_id=0)
    text = tok.decode(out[0, 5:])
    end = free.find(stop) + len(stop)
    assert text[:end] == free[:end] and text[:end].endswith(stop)
    assert out.shape[1] == 5 + end


def test_multi_token_stop_sequences_match_at_the_end():
    model = model_for()
    prompt = torch.tensor([[3, 1, 4]])
    free = generate(model, prompt, 20)
    seq = free[0, 8:10].tolist()
    out = generate(model, prompt, 20, stop=[seq])
    assert out[0, -2:].tolist() == seq and out.shape[1] <= 10


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"max_new_tokens": -1}, "max_new_tokens.*-1"),
        ({"max_new_tokens": 2.0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature.*-1.0"),
        ({"top_k": 0}, "top_k.*0"),
        ({"top_p": 1.01}, "top_p.*1.01"),
        ({"stop": 100}, "stop token id 100"),
        ({"stop": ""}, "empty"),
        ({"pad_id": 100}, "pad_id 100"),
        ({"seed": 1, "generator": torch.Generator()}, "seed or generator"),
    ],
)
def test_bad_arguments_are_errors_before_any_work(kw, match):
    args = {"max_new_tokens": 3, **kw}
    with pytest.raises(LaminaError, match=match):
        stream(model_for(), torch.tensor([[1, 2]]), **args)


def test_empty_prompts_are_errors():
    model = model_for()
    with pytest.raises(LaminaError, match="empty"):
        generate(model, torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(LaminaError, match="prompt 1 is empty"):
        generate(model, [[1, 2], []], 3)


def test_ids_outside_the_vocabulary_are_errors():
    with pytest.raises(LaminaError, match="outside"):
        generate(model_for(), torch.tensor([[1, 100]]), 3)


def test_generated_ids_are_ordinary_tensors():
    """The output can feed a training step (it is not an inference-mode tensor)."""
    model = model_for()
    out = generate(model, torch.tensor([[1, 2]]), 3)
    model.train()
    model(out).sum().backward()
