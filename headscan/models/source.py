"""Where a model spec's weights come from: an embedded alias, a local folder, a ``.gguf`` file or a Hugging Face id
(at a revision, ``ID@REVISION``), read as far as its configuration, with the revision a sweep records (the
Hugging Face commit, or the sha256 of the weight files).

This module does not hook or check models (see `headscan.models.load`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..config import hf_offline
from ..errors import ConfigError, ModelLoadError, ModelNotFoundError
from .aliases import ALIASES
from .gguf import read_gguf
from .hub import hf_cache_revision, not_found, one_line, quiet
from .series import revision_folder, split_revision

__all__ = ["Source", "find_source"]


class Source(NamedTuple):
    """What a spec names, read as far as its configuration (a .gguf file's model and tokenizer too)."""

    source: str  # "alias", "local", "gguf" or "huggingface"
    path: Path | None  # the folder or .gguf file read; None for a Hugging Face id
    named: str | None  # the revision named by ID@REVISION, else None
    target: str  # what the loaders read: a folder or a Hugging Face id
    model_id: str
    revision: str | None
    config: Any
    hf_model: Any = None  # a .gguf file's model, already read
    tokenizer: Any = None


def find_source(spec: str, torch_dtype: torch.dtype) -> Source:
    """Resolve `spec` and read its configuration (a .gguf file whole); any loader's failure names the model."""
    tried = []
    hf_model = tokenizer = None
    try:
        path, source = _locate(spec)
        hub_id, named = split_revision(spec) if path is None else (spec, None)
        if named is not None:  # ID@REVISION: its snapshot, loaded as a local folder by either path
            path = revision_folder(hub_id, named, offline=hf_offline())
        if path is not None and path.suffix == ".gguf":
            revision = _sha256([path])
            hf_model, tokenizer = read_gguf(path, dtype=torch_dtype, sha256=revision)
            config, target, model_id = hf_model.config, str(path.parent), str(path)
        elif named is not None:
            target, model_id, revision = str(path), hub_id, named
            config = _read_config(spec, target, source, tried)
        elif path is not None:
            target, model_id, revision = str(path), str(path), _sha256(_weight_files(path))
            config = _read_config(spec, target, source, tried)
        else:
            target, model_id, revision = spec, spec, hf_cache_revision(spec)
            tried.append(f"no embedded alias or local path {spec!r}")
            if revision is None and hf_offline():
                tried.append("not in the local Hugging Face cache (HF_HUB_OFFLINE is set)")
                raise not_found(spec, tried)
            config = _read_config(spec, target, source, tried)
        if source == "alias":  # a machine's site-packages path means nothing elsewhere; name the package
            model_id = f"{ALIASES[spec].id()}: {path.name}"
    except (ModelNotFoundError, ConfigError):
        raise
    except Exception as error:  # the loaders raise many kinds; name the model and keep the cause
        raise ModelLoadError(f"model {spec!r} could not be loaded: {one_line(error)}") from error
    return Source(source, path, named, target, model_id, revision, config, hf_model, tokenizer)


def _locate(spec: str) -> tuple[Path | None, str]:
    """The path `spec` names (None for a Hugging Face id) and its source."""
    if spec in ALIASES:
        alias = ALIASES[spec]
        try:
            return alias.locate(), "alias"
        except (ModuleNotFoundError, ImportError):
            raise ModelNotFoundError(
                f"embedded model {spec!r} is not installed; install it with: {alias.install}"
            ) from None
    if Path(spec).expanduser().exists():
        path = Path(spec).expanduser().resolve()
        source = "gguf" if path.suffix == ".gguf" else "local"
        if source == "local" and not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"{path}: a local model folder needs config.json and the weights "
                f"(a folder written by save_pretrained), or pass a .gguf file"
            )
        return path, source
    return None, "huggingface"


def _read_config(spec: str, target: str, source: str, tried: list[str]):
    from transformers import AutoConfig

    try:
        with quiet():
            return AutoConfig.from_pretrained(target)
    except OSError as error:
        if source != "huggingface":
            raise
        tried.append(f"Hugging Face said: {str(error).splitlines()[0].rstrip('.')}")
        raise not_found(spec, tried) from None


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.suffix in {".safetensors", ".bin", ".gguf", ".pt"} and p.is_file()]
