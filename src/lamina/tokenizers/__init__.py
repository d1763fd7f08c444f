"""Layer 2, tokenizers: every kind lamina runs, and each format's tokenizer files read and written.

``kinds``: the Tokenizer protocol, the registry of kinds saved as JSON (``save_tokenizer`` /
``load_tokenizer``) and the character tokenizer. ``subword``: byte, byte-level BPE trained on a
corpus (``bpe_trainer``) and GPT-2's BPE. ``pretrained``: a real model's tokenizer (any
``tokenizers`` JSON) with its special ids, add-bos rule and chat template; ``chat_template``
renders that template, within ``template_bounds``' limits. Formats, read and write side by side: ``hf_folder`` reads a Hugging
Face folder's tokenizer files, ``hf_files`` opens and writes them for any kind; ``gguf_vocab``
reads a GGUF file's ``tokenizer.ggml.*`` metadata, ``gguf_metadata`` writes it.

Importing the package registers every kind (char, byte, bpe, gpt2, pretrained).

What this package deliberately does not know: models, tensors, corpora and training; model
files other than their tokenizer parts (lamina.interop reads the GGUF file and hands over its
metadata). It imports only the leaves (lamina.errors, lamina.files).
"""

from __future__ import annotations

from lamina.tokenizers.kinds import (
    CharTokenizer,
    Tokenizer,
    known_tokenizer_kinds,
    load_tokenizer,
    register_tokenizer,
    save_tokenizer,
    tokenizer_from_dict,
)
from lamina.tokenizers.pretrained import PretrainedTokenizer
from lamina.tokenizers.subword import BPETokenizer, ByteTokenizer, GPT2Tokenizer

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "GPT2Tokenizer",
    "PretrainedTokenizer",
    "Tokenizer",
    "known_tokenizer_kinds",
    "load_tokenizer",
    "register_tokenizer",
    "save_tokenizer",
    "tokenizer_from_dict",
]
