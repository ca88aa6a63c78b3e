"""Shared helpers for finding and loading checkpoints, used across `headscan.models`: the local Hugging Face
cache, quiet loading, one-line messages, the architecture's name and whether TransformerLens has an adapter for it.

This module loads no model and imports neither torch nor transformers at import time (`headscan.models.specs`
checks specs before torch loads).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

from ..errors import ModelNotFoundError
from .aliases import alias_status

__all__ = ["hf_cache_revision", "quiet", "not_found", "one_line", "architecture_name", "has_adapter"]


def hf_cache_revision(model_id: str, revision: str | None = None) -> str | None:
    """The commit hash of `model_id` (at `revision`, else its default branch) in the local Hugging Face cache, or
    None if it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(model_id, "config.json", revision=revision)
    if not isinstance(found, str):
        return None
    parts = Path(found).parts  # .../models--org--name/snapshots/<commit>/config.json
    return parts[-2] if len(parts) >= 2 and parts[-3] == "snapshots" else None


@contextlib.contextmanager
def quiet():
    """Silence the loaders' progress bars and chatter: headscan prints its own progress."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def not_found(spec: str, tried: list[str]) -> ModelNotFoundError:
    installed = ", ".join(f"{n}{'' if p else ' (not installed)'}" for n, p in alias_status().items())
    return ModelNotFoundError(
        f"model {spec!r} not found. Tried: {'; '.join(tried)}. "
        f"Embedded aliases that work offline: {installed}. "
        f"To use a Hugging Face model offline, download it once on a machine with a network "
        f"(python -c \"from huggingface_hub import snapshot_download; snapshot_download('{spec}')\"), "
        f"then set HF_HUB_OFFLINE=1; or pass a local folder holding config.json and the weights."
    )


def one_line(error: BaseException, limit: int = 200) -> str:
    """`error` as a short line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def architecture_name(config) -> str:
    """The architecture's name for messages: the checkpoint's class, else its model_type."""
    return ((getattr(config, "architectures", None) or [None])[0] or getattr(config, "model_type", None)
            or type(config).__name__)


def has_adapter(config) -> bool:
    """Whether TransformerLens has an adapter for this architecture (without its long list when not)."""
    from transformer_lens.model_bridge.sources.transformers import determine_architecture_from_hf_config

    try:
        determine_architecture_from_hf_config(config)
    except ValueError:
        return False
    return True
