"""Sliding windows: how far each layer's queries can see, read from the model's configuration.

Some layers mask keys beyond a fixed distance from the query as well as (in decoders) the future: Mistral's
and Phi-3's every layer, Gemma 2's and Gemma 3's local layers, GPT-Neo's local layers, ModernBERT's local
layers (a window on both sides). What a head *could* have attended to is what its chance level is measured
against (`headscan.metrics.chance`), so each layer's window is read here, once, in the form the metrics use:
the largest distance ``|q - k|`` a query sees, or None where only the causal mask (or nothing) limits it.

Hugging Face's masks (``transformers.masking_utils``), for a window ``w`` from the configuration:

- causal sliding window: key k is seen when ``k > q - w``: the farthest key is ``w - 1`` back;
- bidirectional sliding window (ModernBERT): seen when ``|q - k| <= w``;
- GPT-Neo's local layers: ``window_size`` keys, the query's own included: ``window_size - 1`` back.

Where the configuration names per-layer ``layer_types``, they decide; a type other than full or sliding
attention (chunked attention, linear attention) is not modelled here and reported by `window_notes`.
`tests/test_architectures.py` checks the result against the zeros of Hugging Face's own eager attention for
every architecture headscan supports.
"""

from __future__ import annotations

__all__ = ["attention_windows", "window_notes"]

_FULL = "full_attention"
_SLIDING = "sliding_attention"


def _layer_kinds(config, n_layers: int) -> list[str]:
    """"full", "sliding" or the configuration's own name of an unmodelled kind, per layer."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and len(layer_types) == n_layers:
        return ["full" if kind == _FULL else "sliding" if kind == _SLIDING else str(kind) for kind in layer_types]
    attention_layers = getattr(config, "attention_layers", None)  # GPT-Neo: "global" / "local"
    if attention_layers is not None and len(attention_layers) == n_layers:
        return ["sliding" if kind == "local" else "full" for kind in attention_layers]
    # Mistral, Mixtral, Phi-3, Starcoder2: one window for every layer, when the configuration sets one
    return ["sliding" if getattr(config, "sliding_window", None) else "full"] * n_layers


def attention_windows(config, n_layers: int, *, causal: bool) -> tuple[int | None, ...]:
    """Per layer, the largest distance |q - k| between a query and a key it sees; None: no window.

    `config` is the model's (text) configuration, `n_layers` its layer count, `causal` whether its queries see
    only the past.

    >>> from transformers import MistralConfig, Gemma2Config
    >>> attention_windows(MistralConfig(sliding_window=6, num_hidden_layers=2), 2, causal=True)
    (5, 5)
    >>> attention_windows(Gemma2Config(sliding_window=6, num_hidden_layers=2,
    ...                                layer_types=["sliding_attention", "full_attention"]), 2, causal=True)
    (5, None)
    >>> from transformers import ModernBertConfig  # a local window of 1: each query sees itself alone
    >>> attention_windows(ModernBertConfig(num_hidden_layers=3, local_attention=1), 3, causal=False)
    (None, 0, 0)
    """
    kinds = _layer_kinds(config, n_layers)
    if "sliding" not in kinds:
        return (None,) * n_layers
    if getattr(config, "attention_layers", None) is not None and getattr(config, "window_size", None):
        width = int(config.window_size) - 1  # GPT-Neo: window_size keys, the query's own included
    else:
        size = getattr(config, "sliding_window", None)
        if size is None:
            return (None,) * n_layers
        width = int(size) - 1 if causal else int(size)
    return tuple(width if kind == "sliding" else None for kind in kinds)


def window_notes(config, n_layers: int) -> list[str]:
    """Layers whose kind of attention `attention_windows` does not model (their chance levels are those of full
    attention), as "layer L: kind" lines; empty for every architecture headscan checks."""
    return [f"layer {layer}: {kind}" for layer, kind in enumerate(_layer_kinds(config, n_layers))
            if kind not in ("full", "sliding")]
