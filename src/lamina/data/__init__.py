"""Layer 3, data: text and token files in, integer arrays and (x, y) int64 tensors out.

Texts become ids through lamina.tokenizers (the layer below); the tokenizer names re-exported
here (CharTokenizer, Tokenizer, load_tokenizer...) are that package's.
``corpus``: read text corpora, encode them to compact numpy arrays, split, save and load.
``text_splits``: a corpus cut into training and validation text by characters, each part
tokenized (bpe fit on the training part) and cached on disk (``LAMINA_CACHE``).
``batches``: reproducible random windows of a token array as (x, y) batches.
``toy_tasks``: synthetic tasks with known answers (first-last, copy, reverse).
``labelled``: labelled texts (CSV/TSV/JSONL/folders), stratified splits, classifier ids, padding.
``instruct``: chat / instruction files -> tokens and assistant-only loss masks.
``genre``: the built-in classification task (comedy, history or tragedy?).
``sources`` / ``shard_build`` / ``shards``: corpora of any size streamed to token shards with a JSON
index (`lamina prepare`), and read back through memory maps (TokenStream, ShardSampler).

What this layer deliberately does not know: models (it never imports ``torch.nn``), devices,
training, and every other part of lamina except the leaves and ``lamina.tokenizers``.
"""

from __future__ import annotations

from lamina.data.batches import WindowSampler, fixed_batches
from lamina.data.corpus import (
    encode_corpus,
    load_corpus,
    load_tokens,
    save_tokens,
    split_tokens,
    token_dtype,
)
from lamina.data.toy_tasks import (
    IGNORE_INDEX,
    PAD_ID,
    SEP_ID,
    TOY_TASKS,
    copy_batch,
    first_last_batch,
    reverse_batch,
)
from lamina.files import atomic_write
from lamina.tokenizers import (
    CharTokenizer,
    PretrainedTokenizer,
    Tokenizer,
    known_tokenizer_kinds,
    load_tokenizer,
    register_tokenizer,
    save_tokenizer,
    tokenizer_from_dict,
)

__all__ = [
    "IGNORE_INDEX",
    "PAD_ID",
    "SEP_ID",
    "TOY_TASKS",
    "CharTokenizer",
    "PretrainedTokenizer",
    "Tokenizer",
    "WindowSampler",
    "atomic_write",
    "copy_batch",
    "encode_corpus",
    "first_last_batch",
    "fixed_batches",
    "known_tokenizer_kinds",
    "load_corpus",
    "load_tokenizer",
    "load_tokens",
    "register_tokenizer",
    "reverse_batch",
    "save_tokenizer",
    "save_tokens",
    "split_tokens",
    "token_dtype",
    "tokenizer_from_dict",
]
