"""Reading a GGUF file as a Hugging Face model, once: the dequantized checkpoint is cached as a folder.

Transformers reads a GGUF file by parsing every metadata field and dequantizing every tensor in Python and numpy:
about 30 s for smollm2's 98 MB on a quiet 2-core machine, on every load. The result is an ordinary float32
checkpoint, so headscan writes it once with ``save_pretrained`` (model and tokenizer) and loads that folder
afterwards (a second or two). The copy is exact: the dequantized float32 values are saved as they are, and any
other dtype is cast from them as the GGUF reader itself would cast.

Where: ``$HEADSCAN_CACHE/gguf/`` (default ``$XDG_CACHE_HOME/headscan`` or ``~/.cache/headscan``), one folder per
file content and transformers version (a new version may convert differently); ``HEADSCAN_CACHE=off`` reads the
file every time. The folder appears whole or not at all (written beside it, then renamed), a second process that
loads the same file meanwhile waits for the first one's copy (`headscan.tables.folders.lock`), and a cache that
cannot be written only costs the speed-up. The model's identity in provenance stays the GGUF file's sha256.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..tables.folders import lock
from .hub import quiet

__all__ = ["cache_root", "read_gguf"]

_COMPLETE = "headscan-complete"  # written last into a cached folder


def cache_root() -> Path | None:
    """headscan's cache folder, or None when ``HEADSCAN_CACHE`` is ``off`` (or ``0``, ``no``, ``false``)."""
    setting = os.environ.get("HEADSCAN_CACHE", "")
    if setting.lower() in {"off", "0", "no", "false"}:
        return None
    if setting:
        return Path(setting).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "headscan"


def _cached_folder(sha256: str) -> Path | None:
    import transformers

    root = cache_root()
    if root is None:
        return None
    return root / "gguf" / f"{sha256.removeprefix('sha256:')[:32]}-transformers-{transformers.__version__}"


def _read(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        # Eager attention so that the attention weights exist to be hooked.
        hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, attn_implementation="eager",
                                                        dtype=dtype)
    return hf_model, tokenizer


def _save_model(hf_model, folder: Path) -> None:
    """The weights as safetensors and the config without its GGUF quantization entry: ``save_pretrained`` refuses
    a model loaded from GGUF (its quantizer is not serializable), though the weights are plain dequantized floats."""
    from safetensors.torch import save_model

    config = copy.deepcopy(hf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(folder)
    if getattr(hf_model, "generation_config", None) is not None:
        hf_model.generation_config.save_pretrained(folder)
    save_model(hf_model, str(folder / "model.safetensors"), metadata={"format": "pt"})  # tied weights stored once


def _write(folder: Path, hf_model, tokenizer) -> None:
    """`folder` whole or not at all; nothing when the cache cannot be written."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError:
        return
    try:
        with quiet():
            _save_model(hf_model, partial)
            tokenizer.save_pretrained(partial)
        (partial / _COMPLETE).write_text("written by headscan from a GGUF file\n")
        os.replace(partial, folder)
    except Exception:  # read-only, full, a model transformers cannot save, or another process renamed its copy
        pass  # first (that one is as good): the cache only saves time, so it never stops a load
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _from_folder(folder: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with quiet():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        hf_model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=dtype)
    return hf_model, tokenizer


def read_gguf(path: Path, *, dtype: torch.dtype, sha256: str) -> tuple[Any, Any]:
    """The Hugging Face model (eager attention) and tokenizer of the GGUF file at `path` (content `sha256`), from
    the cache when a copy is there, else read from the file and cached."""
    folder = _cached_folder(sha256)
    if folder is None:
        return _read(path, dtype)
    if not (folder / _COMPLETE).is_file():
        # one process converts, a second waits for its copy instead of converting the same file beside it
        with lock(folder, f"{path.name}'s cached copy", wait=True, waiting=lambda line: print(line, file=sys.stderr)):
            if not (folder / _COMPLETE).is_file():
                hf_model, tokenizer = _read(path, torch.float32)  # the dequantized values as they are
                _write(folder, hf_model, tokenizer)
                if not (folder / _COMPLETE).is_file():  # not cached: what was read, in the dtype asked for
                    return (hf_model, tokenizer) if dtype == torch.float32 else _read(path, dtype)
    # from the folder even right after writing it, so that the first load and every later one build the model
    # the same way (a dtype is then applied as from_pretrained applies it, buffers included)
    return _from_folder(folder, dtype)
