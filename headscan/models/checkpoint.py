"""What a checkpoint holds: whether its weights include a trained language-model head.

Scores that read the unembedding (the OV copying score, direct logit attribution) mean something only where
the model was trained with it. A checkpoint saved without its LM head (all-MiniLM-L6-v2 is a ``BertModel``:
encoder and pooler, no masked-LM head) still loads into a class that has one, and transformers fills the
missing head with fresh random weights (or ties the decoder to the input embedding, leaving its dense layer
and norm random). `untrained_head` says so from the checkpoint's own files: the head's parameters are those
of the loaded Hugging Face model outside its base model (``base_model_prefix``), less any tied to the input
embedding (which the checkpoint holds as the embedding); the head is trained when the weight files hold
every one of them.

This module reads weight files' names and keys only; it loads no tensor and scores nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["head_parameters", "checkpoint_keys", "untrained_head"]


def head_parameters(hf_model) -> list[str]:
    """The names of `hf_model`'s parameters outside its base model, tied ones left out (transformers'
    ``named_parameters`` lists a tied matrix once, under the input embedding's name)."""
    prefix = getattr(hf_model, "base_model_prefix", "") or ""
    if not prefix or getattr(hf_model, prefix, None) is None:
        return []  # a base model itself (AutoModel): no head
    return [name for name, _ in hf_model.named_parameters() if not name.startswith(prefix + ".")]


def _normal(key: str) -> str:
    # Old BERT checkpoints call LayerNorm's parameters gamma and beta; transformers renames them on loading.
    return key.replace(".gamma", ".weight").replace(".beta", ".bias")


def checkpoint_keys(folder: Path) -> set[str] | None:
    """The tensor names in the weight files of a checkpoint folder (safetensors, PyTorch .bin, or their
    sharded index), or None when there are none that can be read."""
    keys: set[str] = set()
    for index in sorted(folder.glob("*.index.json")):
        try:
            keys |= set(json.loads(index.read_text()).get("weight_map", {}))
        except (OSError, ValueError):
            continue
    if keys:
        return {_normal(k) for k in keys}
    found = False
    for path in sorted(folder.glob("*.safetensors")):
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            keys |= set(handle.keys())
        found = True
    if not found:
        for path in sorted(folder.glob("*.bin")):
            import torch

            state = torch.load(path, map_location="meta", weights_only=True, mmap=True)
            keys |= set(state)
            found = True
    return {_normal(k) for k in keys} if found else None


def _gguf_keys(path: Path) -> set[str] | None:
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    return {tensor.name for tensor in GGUFReader(str(path)).tensors}


def _folder_of(model) -> Path | None:
    """The folder holding `model`'s weight files, where there is one on this machine."""
    if model.source == "local":
        path = Path(model.id)
        return path if path.is_dir() else None
    if model.source == "alias":
        from .aliases import ALIASES

        alias = ALIASES.get(model.name)
        path = alias.locate() if alias is not None else None
        return path if path is not None and path.is_dir() else None
    if model.source == "huggingface":
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(model.id, local_files_only=True))
        except Exception:  # not in the cache, or no hub client: the check cannot be made
            return None
    return None


def untrained_head(model) -> str | None:
    """Why `model`'s (a `HookedModel`) checkpoint holds no trained LM head, in one line; None when it holds one,
    or when its files cannot be read to tell (the scores are then kept).

    A GGUF file holds a trained head when its unembedding is tied to the embedding or stored (``output.weight``).
    """
    hf_model = model.hf_model
    if model.source == "gguf":
        config = hf_model.config.get_text_config()
        if getattr(config, "tie_word_embeddings", False):
            return None
        keys = _gguf_keys(Path(model.id))
        if keys is None or "output.weight" in keys:
            return None
        return f"{Path(model.id).name} holds no output.weight and does not tie its unembedding to the embedding"
    wanted = head_parameters(hf_model)
    if not wanted:
        return None
    folder = _folder_of(model)
    keys = checkpoint_keys(folder) if folder is not None else None
    if keys is None:
        return None
    missing = [name for name in wanted if name not in keys]
    if not missing:
        return None
    architectures = getattr(hf_model.config, "architectures", None) or ["?"]
    return (f"the checkpoint ({', '.join(architectures)}) holds no trained LM head: {len(missing)} of the "
            f"{type(hf_model).__name__} head's {len(wanted)} parameters are not in its weights "
            f"({missing[0]}, ...), so transformers drew them at random; scores that read the unembedding would "
            f"read an untrained one")
