"""A tiny chat tokenizer for tests that need a chat template without a real model."""

from __future__ import annotations

SPECIALS = ["<|im_start|>", "<|im_end|>"]
CHARS = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,?!'\n:0123456789"


class ChatMLChars:
    """A character tokenizer with ChatML's two special tokens and its template."""

    chat_template = "chatml"

    def __init__(self) -> None:
        self.itos = SPECIALS + list(CHARS)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.eot_ids = (self.stoi["<|im_end|>"],)
        self.calls = 0

    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            special = next((s for s in SPECIALS if text.startswith(s, i)), None)
            if special:
                ids.append(self.stoi[special])
                i += len(special)
            else:
                ids.append(self.stoi[text[i]])
                i += 1
        return ids

    def decode(self, ids) -> str:
        return "".join(self.itos[i] for i in ids)

    def render_chat_text(self, messages, add_generation_prompt=True) -> str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def render_chat(self, messages, add_generation_prompt=True) -> list[int]:
        self.calls += 1
        return self.encode(self.render_chat_text(messages, add_generation_prompt))
