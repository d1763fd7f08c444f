"""Instruction data (lamina.data.instruct): the four file formats, the assistant-only loss
mask (proved on a model's loss), plain-text layouts, and rows that never see each other."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from lamina import GPT, GPTConfig, LaminaError
from lamina.data.instruct import (
    IGNORE,
    Example,
    encode_example,
    pad_rows,
    parse_record,
    read_examples,
)
from lamina.tokenizers.kinds import CharTokenizer

CHAT = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "Bye."},
    ]
}


class ChatTok:
    """A character tokenizer with a ChatML-like template, as a PretrainedTokenizer offers it."""

    chat_template = "chatml"
    START, END = 100, 101
    eot_ids = (END,)
    eos_id, bos_id, add_bos = END, None, False

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 100 for c in text]

    def chat_with_mask(self, messages):
        ids, mask = [], []
        for m in messages:
            head = [self.START, *self.encode(m["role"] + "\n")]
            body = self.encode(m["content"])
            ids += head + body + [self.END] + self.encode("\n")
            a = m["role"] == "assistant"
            mask += [False] * len(head) + [a] * len(body) + [False, False]
        return ids, mask


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_the_four_formats_are_read_from_their_content(tmp_path):
    chat = _write(tmp_path, "a.jsonl", json.dumps(CHAT) + "\n\n" + json.dumps(CHAT) + "\n")
    pc = _write(tmp_path, "b.data", json.dumps({"prompt": "2+2=", "completion": "4"}) + "\n")
    alpaca = [{"instruction": "Add.", "input": "2 and 2", "output": "4"},
              {"instruction": "Say hi.", "output": "Hi"}]  # fmt: skip
    al = _write(tmp_path, "c.json", json.dumps(alpaca))
    txt = _write(tmp_path, "d.txt", "First Citizen:\nBefore we proceed\n")
    a = read_examples(chat)
    assert [e.kind for e in a] == ["chat", "chat"] and len(a[0].messages) == 5
    (b,) = read_examples(pc)
    assert b.messages == ({"role": "user", "content": "2+2="},
                          {"role": "assistant", "content": "4"})  # fmt: skip
    c = read_examples(al)
    assert c[0].messages[0]["content"] == "Add.\n\n2 and 2" and c[1].kind == "alpaca"
    assert read_examples(txt) is None
    assert read_examples(_write(tmp_path, "e.txt", "[Enter HAMLET]\nTo be")) is None


def test_bad_records_name_the_file_line_and_field(tmp_path):
    bad = _write(
        tmp_path, "x.jsonl", json.dumps(CHAT) + "\n" + '{"prompt": 3, "completion": "a"}\n'
    )
    with pytest.raises(LaminaError, match=r"x.jsonl line 2: field 'prompt' must be a string"):
        read_examples(bad)
    with pytest.raises(LaminaError, match="line 2: not valid JSON"):
        read_examples(_write(tmp_path, "y.jsonl", json.dumps(CHAT) + "\n{oops\n"))
    with pytest.raises(LaminaError, match="role among"):
        parse_record({"messages": [{"role": "robot", "content": "x"}]}, "here")
    with pytest.raises(LaminaError, match="no assistant turn"):
        parse_record({"messages": [{"role": "user", "content": "x"}]}, "here")
    with pytest.raises(LaminaError, match="needs 'messages'"):
        parse_record({"text": "x"}, "here")


def test_chat_mask_covers_assistant_content_and_its_end_of_turn():
    tok = ChatTok()
    ex = parse_record(CHAT, "t")
    ids, mask = encode_example(tok, ex)
    learned = [i for i, m in zip(ids, mask, strict=True) if m]
    assert learned == tok.encode("Hello.") + [tok.END] + tok.encode("Bye.") + [tok.END]
    ids2, mask2 = encode_example(tok, ex, train_on_prompt=True)
    assert ids2 == ids and all(mask2)


def test_plain_tokenizers_get_plain_layouts():
    tok = CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ#:.?+=24 \n")
    pc = parse_record({"prompt": "2+2=", "completion": "4"}, "t")
    ids, mask = encode_example(tok, pc)
    assert tok.decode(ids) == "2+2=4" and mask == [False] * 4 + [True]
    al = parse_record({"instruction": "Add.", "input": "2 and 2", "output": "4"}, "t")
    ids, mask = encode_example(tok, al)
    text = tok.decode(ids)
    assert text.startswith("### Instruction:\nAdd.\n\n### Input:\n2 and 2") and text[-1] == "4"
    assert mask.count(True) == 1


def _loss(model, inputs, targets):
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def test_loss_is_unchanged_when_a_prompt_tokens_target_changes():
    """Targets come from a copy of the ids with one prompt token replaced: same loss. Replace an
    assistant token instead (or train on the prompt), and the loss changes."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=102, block_size=64, d_model=16, n_heads=2, n_layers=1))
    tok = ChatTok()
    ids, mask = encode_example(tok, parse_record(CHAT, "t"))
    inputs, targets = pad_rows([(ids, mask)], 64)
    base = _loss(model, inputs, targets)
    prompt_pos = next(i for i in range(1, len(ids)) if not mask[i])
    answer_pos = next(i for i in range(1, len(ids)) if mask[i])

    def targets_with(pos, m):
        changed = list(ids)
        changed[pos] = (changed[pos] + 7) % 100
        return pad_rows([(changed, m)], 64)[1]

    assert torch.equal(_loss(model, inputs, targets_with(prompt_pos, mask)), base)
    assert not torch.equal(_loss(model, inputs, targets_with(answer_pos, mask)), base)
    everything = [True] * len(ids)
    full = _loss(model, inputs, pad_rows([(ids, everything)], 64)[1])
    assert not torch.equal(_loss(model, inputs, targets_with(prompt_pos, everything)), full)


def test_rows_never_attend_to_each_other_or_to_pads():
    """An example's logits are the same alone and in a batch with a longer, padded neighbour."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=102, block_size=64, d_model=16, n_heads=2, n_layers=2)).eval()
    tok = ChatTok()
    short = encode_example(tok, parse_record({"prompt": "hi", "completion": "yo"}, "t"))
    long = encode_example(tok, parse_record(CHAT, "t"))
    alone, t_alone = pad_rows([short], 64)
    both, t_both = pad_rows([short, long], 64, pad_id=7)
    n = alone.shape[1]
    assert both.shape[1] > n and (t_both[0, n:] == IGNORE).all()
    with torch.no_grad():
        torch.testing.assert_close(model(both)[0, :n], model(alone)[0], atol=1e-6, rtol=0)
    assert torch.equal(t_both[0, :n], t_alone[0])


def test_long_rows_are_cut_to_the_block():
    ids, mask = list(range(1, 30)), [False] * 5 + [True] * 24
    inputs, targets = pad_rows([(ids, mask)], 8)
    assert inputs.shape == (1, 8) and inputs[0].tolist() == ids[:8]
    assert targets[0].tolist() == [IGNORE] * 4 + ids[5:9]


def test_an_example_without_targets_is_refused():
    tok = CharTokenizer.from_text("ab")
    ex = Example("completion", ({"role": "user", "content": "ab"},
                                {"role": "assistant", "content": ""}), "f line 1")  # fmt: skip
    with pytest.raises(LaminaError, match="f line 1: the example has no tokens"):
        encode_example(tok, ex)
