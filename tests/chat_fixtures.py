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


def chat_engine(max_tokens: int = 32):
    """A serve Engine over a tiny random llama-tiny GPT with the ChatML character tokenizer."""
    import torch

    from lamina.models import GPT, GPTConfig
    from lamina.serve import Engine, Limits

    tok = ChatMLChars()
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, block_size=256)
    return Engine(talkative(GPT(config).eval(), tok), tok, Limits(max_tokens=max_tokens))


def talkative(model, tok):
    """A random model whose end-of-turn logit is 0 (its head row zeroed): it rarely ends a
    turn at once, so replies have text to compare (a random one often starts with the eot)."""
    import torch

    with torch.no_grad():
        for i in tok.eot_ids:
            model.head.weight[i] = 0.0
    return model


def fresh_reply(engine, messages: list[dict], n: int) -> str:
    """The reference reply: the whole conversation rendered and prefilled at once, greedy."""
    import torch

    from lamina.generation import generate

    tok = engine.tokenizer
    ids = tok.render_chat(messages, add_generation_prompt=True)
    out = generate(engine.model, torch.tensor([ids]), n, stop=list(tok.eot_ids))[0, len(ids) :]
    out = out.tolist()
    return tok.decode(out[: out.index(tok.eot_ids[0])] if tok.eot_ids[0] in out else out)
