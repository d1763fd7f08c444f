"""The tokenizer files of a Hugging Face model folder -> PretrainedTokenizer's arguments.

    read_hf_tokenizer(dir) -> (fields, extra_end_of_turn_ids)

Read, in this order of precedence (each optional but tokenizer.json):
- tokenizer.json: the ``tokenizers`` pipeline itself;
- tokenizer_config.json: bos_token / eos_token / pad_token / unk_token (a string or an
  AddedToken object), add_bos_token, chat_template (a string, or a list of named templates:
  "default" is taken), added_tokens_decoder (tokens the JSON lacks are added, as transformers
  does);
- special_tokens_map.json: the special tokens tokenizer_config.json does not name;
- chat_template.jinja: the template (it wins over tokenizer_config.json's);
- generation_config.json: eos_token_id, an id or a list of ids, all of which end a turn.
Without add_bos_token, the rule is read from the pipeline's post-processor (does it put bos
before a text?). A broken file is one LaminaError line naming it.

tokenizer.json is run as written. transformers 5 instead rebuilds the pipeline of a folder
whose tokenizer_class has its own design (LlamaTokenizer, GPT2Tokenizer...) from the vocabulary
and that class; where the file says otherwise (Llama 2's legacy Prepend/Replace normalizer,
SmolLM2's digit splitting) ids can differ at a leading space or a digit after spaces. Folders
transformers 5 itself saves agree exactly.

What this module deliberately does not know: model weights and config.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lamina.errors import LaminaError
from lamina.files import loads_json

ROLES = ("bos", "eos", "pad", "unk")


def _json(path: Path, required: bool = False) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise LaminaError(f"{path.parent} has no {path.name}: no tokenizer to read")
        return {}
    try:
        data = loads_json(path.read_bytes().decode("utf-8"), str(path))
    except (UnicodeDecodeError, ValueError) as e:
        raise LaminaError(f"{path} is not UTF-8 JSON: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise LaminaError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise LaminaError(f"{where} must be a token string or an AddedToken object, got {value!r}")


def _template(config: dict[str, Any], directory: Path) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise LaminaError(f"{jinja} is not UTF-8 text") from None
    value = config.get("chat_template")
    if isinstance(value, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use"...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default", next(iter(named.values()), None))
    if value is not None and not isinstance(value, str):
        raise LaminaError(f"{directory / 'tokenizer_config.json'}: chat_template is not a string")
    return value


def _add_declared_tokens(tok: Any, config: dict[str, Any]) -> bool:
    """Add the tokens tokenizer_config.json declares in added_tokens_decoder that tok lacks."""
    from tokenizers import AddedToken

    have = {t.content for t in tok.get_added_tokens_decoder().values()}
    declared = config.get("added_tokens_decoder") or {}
    if not isinstance(declared, dict):
        return False
    added = False
    keys = ("single_word", "lstrip", "rstrip", "normalized", "special")
    for _, spec in sorted(declared.items(), key=lambda kv: int(kv[0])):
        if not isinstance(spec, dict) or spec.get("content") in have:
            continue
        opts = {k: bool(spec[k]) for k in keys if k in spec}
        token = AddedToken(str(spec["content"]), **opts)
        if opts.get("special"):
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        added = True
    return added


def _adds_bos(tok: Any, bos: int | None) -> bool:
    if bos is None:
        return False
    with_specials = tok.encode("a", add_special_tokens=True).ids
    return with_specials[:1] == [bos] and tok.encode("a", add_special_tokens=False).ids[:1] != [bos]


def read_hf_tokenizer(directory: Path) -> tuple[dict[str, Any], list[int]]:
    """PretrainedTokenizer's keyword arguments (hf_json first) and generation_config's eos ids."""
    from tokenizers import Tokenizer

    if not directory.is_dir():
        raise LaminaError(f"{directory} is not a folder")
    path = directory / "tokenizer.json"
    _json(path, required=True)
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception
        msg = " ".join(str(e).split())
        raise LaminaError(f"{path} is not readable by `tokenizers`: {msg}") from None
    config = _json(directory / "tokenizer_config.json")
    specials = _json(directory / "special_tokens_map.json")
    changed = _add_declared_tokens(tok, config)
    ids: dict[str, int | None] = {}
    for role in ROLES:
        key = f"{role}_token"
        where = "tokenizer_config.json" if key in config else "special_tokens_map.json"
        text = _content(config.get(key, specials.get(key)), f"{where} {key}")
        ids[role] = None if text is None else tok.token_to_id(text)
        if text is not None and ids[role] is None:
            raise LaminaError(f"{directory / where}: {key} {text!r} is not in the vocabulary")
    add_bos = config.get("add_bos_token")
    if add_bos is None:
        add_bos = _adds_bos(tok, ids["bos"])
    elif not isinstance(add_bos, bool):
        raise LaminaError(f"{directory / 'tokenizer_config.json'}: add_bos_token is not a bool")
    generation = _json(directory / "generation_config.json")
    eos = generation.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [] if eos is None else [eos]
    n = tok.get_vocab_size(with_added_tokens=True)
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in eos_list):
        raise LaminaError(
            f"{directory / 'generation_config.json'}: eos_token_id {eos!r} is not ids"
        )
    if ids["eos"] is None and eos_list:
        ids["eos"] = eos_list[0]
    fields = {f"{r}_id": ids[r] for r in ROLES}
    fields.update(add_bos=bool(add_bos) and ids["bos"] is not None)
    fields.update(
        hf_json=tok.to_str() if changed else path.read_text(encoding="utf-8"),
        chat_template=_template(config, directory),
    )
    return fields, eos_list
