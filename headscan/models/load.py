"""Load hooked models: a spec (embedded alias, local checkpoint, GGUF file or Hugging Face id) to a `HookedModel`.

A sweep reads every layer's attention pattern, (batch, head, q, k), as the forward pass produces it. A
`HookedModel` reaches it by one of two paths and hides which (its provenance records it as ``path``):

- ``transformer_lens``: TransformerLens 4.x's `TransformerBridge.boot_transformers`, whose
  ``blocks.{L}.attn.hook_pattern`` exists for causal and encoder models alike. Taken wherever TransformerLens
  has an adapter for the architecture.
- ``hf_hooks``: PyTorch forward hooks on the Hugging Face model's own attention modules, run with eager
  attention, reading the weights each module returns (the model is loaded with the language-model head its
  checkpoint was saved with, for head importance; patterns are read from its backbone). Taken for architectures TransformerLens cannot bridge
  (DistilBERT, DeBERTa-v2, ELECTRA, ALBERT, ...), and when the bridge fails on a model it claims.

Either way the model is checked on a probe sentence as it loads: every layer must hand over one pattern of
(1, head, q, q) whose rows sum to 1, lower-triangular exactly when the model is causal. The families verified
against Hugging Face's eager attention are listed in `headscan.testing.architectures`.

Under ``attention="chunked"`` (`headscan.models.forward.pattern_forward`) neither path reads a pattern: the model
runs with headscan's own attention function (`headscan.models.chunked`), which recomputes each layer's rows block
by block; `headscan.models.forward.chunked_refusal` says when a model's scores cannot be reproduced that way. Which path
runs is decided in one place, `headscan.models.forward`.

This module does not score heads or read corpora.
"""

from __future__ import annotations

import torch

from ..config import CONTROLS, DEVICES, control_name
from ..config import DTYPES as DTYPE_NAMES
from ..errors import ConfigError, ModelLoadError, ModelNotFoundError
from . import forward
from .aliases import ALIASES, DEFAULT_MODELS, alias_status  # noqa: F401  (re-exported)
from .hooked import PATHS, HookedModel  # noqa: F401  (re-exported)
from .hooks import PatternSite, Unhookable, discover
from .hub import architecture_name, has_adapter, hf_cache_revision, one_line, quiet
from .random_init import initializer_note, random_init
from .series import checkpoint_step
from .sites import backbone, layer_sites
from .source import Source, find_source
from .specs import check_spec, describe_spec  # noqa: F401  (re-exported)
from .windows import attention_windows

__all__ = ["HookedModel", "PatternSite", "ALIASES", "DEFAULT_MODELS", "DEVICES", "DTYPES", "PATHS", "load_model",
           "check_spec", "describe_spec", "alias_status", "resolve_device"]

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # torch dtypes for SweepConfig's dtype names


# --- loading -----------------------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    """Turn "auto" into the best available device; check the others exist."""
    if device not in DEVICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICES)}; got {device!r}", setting="device")
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda: this torch build sees no CUDA device; use cpu or auto", setting="device")
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("device mps: no Apple MPS device here; use cpu or auto", setting="device")
    return device


def _via_bridge(target: str, *, device: str, dtype: torch.dtype, hf_model=None, tokenizer=None,
                device_map: str | None = None) -> dict:
    """The fields of a HookedModel on the transformer_lens path."""
    from transformer_lens.model_bridge import TransformerBridge

    given = {} if hf_model is None else {"hf_model": hf_model, "tokenizer": tokenizer}
    # A device map places the layers (accelerate); it replaces the single device.
    placement = {"device_map": device_map} if device_map else {"device": device}
    with quiet():
        bridge = TransformerBridge.boot_transformers(target, dtype=dtype, **placement, **given)
    bridge.eval()
    cfg = bridge.cfg
    n_heads = int(cfg.n_heads)
    return {
        "hf_model": bridge.original_model,
        "tokenizer": bridge.tokenizer,
        "bridge": bridge,
        "path": "transformer_lens",
        "family": "bidirectional" if getattr(cfg, "attention_dir", "causal") == "bidirectional" else "causal",
        "n_layers": int(cfg.n_layers),
        "n_heads": n_heads,
        "n_kv_heads": int(getattr(cfg, "n_key_value_heads", None) or n_heads),
        "d_model": int(cfg.d_model),
        "default_bos": bool(cfg.default_prepend_bos),
        "max_context": _max_context(bridge.original_model, default=int(cfg.n_ctx)),
    }


def _via_hooks(target: str, *, device: str, dtype: torch.dtype, hf_model=None, tokenizer=None,
               device_map: str | None = None) -> dict:
    """The fields of a HookedModel on the hf_hooks path: the model with its saved head, with eager attention."""
    if hf_model is None:
        from transformers import AutoTokenizer

        with quiet():
            placement = {"device_map": device_map} if device_map else {}
            hf_model = _with_head(target, attn_implementation="eager", dtype=dtype, **placement)
            tokenizer = AutoTokenizer.from_pretrained(target)
    else:
        hf_model.set_attn_implementation("eager")
        if tokenizer is None:  # a random-init control: the trained model's tokenizer
            from transformers import AutoTokenizer

            with quiet():
                tokenizer = AutoTokenizer.from_pretrained(target)
    hf_model = (hf_model if device_map else hf_model.to(device)).eval()
    found = discover(hf_model, tokenizer)
    config = hf_model.config.get_text_config()
    return {
        "hf_model": hf_model,
        "tokenizer": tokenizer,
        "sites": found["sites"],
        "path": "hf_hooks",
        "family": "causal" if found["causal"] else "bidirectional",
        "n_layers": found["n_layers"],
        "n_heads": found["n_heads"],
        "n_kv_heads": _kv_heads(config, found["n_heads"]),
        "d_model": int(getattr(config, "hidden_size", None) or getattr(config, "d_model", None) or 0),
        "default_bos": True,  # TransformerLens' default for a Hugging Face model its adapters do not override
        "max_context": _max_context(hf_model, default=2048),
    }


def _with_head(target: str, **kwargs):
    """The checkpoint's model with the language-model head it was saved with (a ``...ForMaskedLM`` or
    ``...ForCausalLM``, whose head importance's loss targets read), else its bare model; patterns are read from
    its backbone either way."""
    try:
        return _first_that_fits(_head_classes(target), lambda auto: auto.from_pretrained(target, **kwargs))
    except ValueError as error:
        raise Unhookable(f"transformers has no model class for it ({one_line(error, 120)})") from None


def _head_classes(target: str) -> list:
    """The Auto classes to try for a checkpoint, in order: the language-model head it was saved with, if any,
    then AutoModel (the bare model)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    saved = list(getattr(AutoConfig.from_pretrained(target), "architectures", None) or [])
    heads = [AutoModelForMaskedLM] if any(name.endswith("ForMaskedLM") for name in saved) else \
        [AutoModelForCausalLM] if any(name.endswith(("ForCausalLM", "LMHeadModel")) for name in saved) else []
    return heads + [AutoModel]


def _first_that_fits(classes: list, build):
    """`build(model_class)` for the first of `classes` that transformers maps the config to (a ValueError says it
    does not: fall through to the next, the bare model last); the last one's ValueError is raised."""
    for model_class in classes[:-1]:
        try:
            return build(model_class)
        except ValueError:
            pass
    return build(classes[-1])


def _kv_heads(config, n_heads: int) -> int:
    for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 if getattr(config, "multi_query", False) else n_heads


def _max_context(hf_model, *, default: int) -> int:
    """The longest input the model's positions allow; `default` for models without a limit (ALiBi)."""
    config = hf_model.config.get_text_config()
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            break
    else:
        return default
    # RoBERTa-style learned positions (RoBERTa, XLM-R, MPNet, ...) count from the pad id + 1: the first
    # pad + 1 rows are never used, so 514 positions hold 512 tokens.
    embeddings = getattr(backbone(hf_model), "embeddings", None)
    offset = getattr(embeddings, "padding_idx", None)
    positions = getattr(embeddings, "position_embeddings", None)
    if isinstance(offset, int) and (hasattr(embeddings, "create_position_ids_from_input_ids")
                                    or getattr(positions, "padding_idx", None) == offset):
        value -= offset + 1
    return value


def _describe(name: str, fields: dict, *, prepend_bos: bool | None, **where) -> HookedModel:
    fields = dict(fields)
    tokenizer, hf_model = fields["tokenizer"], fields["hf_model"]
    default_bos = fields.pop("default_bos")

    def token_id(attribute: str) -> int | None:
        value = getattr(tokenizer, attribute, None)
        return int(value) if value is not None else None

    vocab_size = int(getattr(hf_model.config.get_text_config(), "vocab_size", None) or len(tokenizer))
    special = {"bos": token_id("bos_token_id"), "cls": token_id("cls_token_id"), "sep": token_id("sep_token_id"),
               "pad": token_id("pad_token_id")}
    # TransformerLens registers "<|endoftext|>" as EOS/BOS when a tokenizer has neither: an id past the
    # embedding matrix, which the model cannot take.
    special = {key: None if value is None or value >= vocab_size else value for key, value in special.items()}
    if fields["family"] == "bidirectional":
        special["bos"] = None  # encoders open with [CLS]; some tokenizers report [UNK] or [CLS] as "bos"
        prepend = False
    else:
        special["cls"] = special["sep"] = None
        if special["bos"] is None:
            eos = token_id("eos_token_id")  # as TransformerLens does: EOS stands in for a missing BOS
            special["bos"] = eos if eos is not None and eos < vocab_size else None
        prepend = default_bos if prepend_bos is None else prepend_bos
        if prepend and special["bos"] is None:
            if prepend_bos:
                raise ConfigError(f"prepend_bos: model {name!r} has no BOS (nor EOS) token to put before each "
                                  f"segment; leave it out (--bos no)", setting="prepend_bos")
            prepend = False
    text_config = hf_model.config.get_text_config()
    windows = attention_windows(text_config, fields["n_layers"], causal=fields["family"] == "causal")
    sites = layer_sites(hf_model, bridge=fields.get("bridge"), attention=fields.pop("sites", ()),
                        n_layers=fields["n_layers"])
    return HookedModel(
        name=name,
        special_token_ids=special,
        windows=windows if any(w is not None for w in windows) else (),  # () where no layer has one
        prepend_bos=prepend,
        n_params=int(sum(p.numel() for p in hf_model.parameters())),
        vocab_size=vocab_size,
        layer_sites=sites,
        **fields,
        **where,
    )


def _hook(name: str, target: str, config, *, device: str, dtype: torch.dtype, prepend_bos: bool | None,
          hf_model=None, tokenizer=None, device_map: str | None = None, **where) -> HookedModel:
    """Hook the model through the bridge where TransformerLens has an adapter, else (or if that fails) through
    hooks on its Hugging Face attention modules; each path must pass the probe check."""
    architecture = architecture_name(config)
    if getattr(config, "is_encoder_decoder", False):
        raise ModelLoadError(
            f"model {name!r} ({architecture}) is an encoder-decoder model: headscan reads the self-attention of "
            f"encoder-only and decoder-only models (this one would need decoder inputs and a choice of stack)"
        )
    adapter = has_adapter(config)
    failures = [] if adapter else ["TransformerLens has no adapter for it"]
    last = None
    for via in (_via_bridge, _via_hooks) if adapter else (_via_hooks,):
        try:
            fields = via(target, device=device, dtype=dtype, hf_model=hf_model, tokenizer=tokenizer,
                         device_map=device_map)
            model = _describe(name, fields, prepend_bos=prepend_bos, **where)
            forward.check(model)
        except (ConfigError, ModelNotFoundError):
            raise
        except Exception as error:  # the loaders raise many kinds; keep one short line of each
            label = "the TransformerLens bridge" if via is _via_bridge else "hooks on its attention modules"
            failures.append(f"{label}: {error if isinstance(error, Unhookable) else one_line(error)}")
            last = error
            continue
        if adapter and failures:
            model.extra["bridge_failure"] = failures[0]
        return model
    needed = ""
    if isinstance(last, Unhookable):
        bridge = ("a bridge whose blocks.L.attn.hook_pattern fires" if adapter
                  else f"a TransformerLens adapter for {architecture}")
        needed = (f". To sweep it headscan needs {bridge}, or attention modules that return their (batch, head, q, k) "
                  f"weights under eager attention")
    raise ModelLoadError(f"model {name!r} ({architecture}) could not be hooked: {'; '.join(failures)}{needed}") from last


def load_model(
    spec: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    prepend_bos: bool | None = None,
    device_map: str | None = None,
    control: str | None = None,
    control_seed: int = 0,
) -> HookedModel:
    """Load and hook the model named by `spec` (or a control of it, named ``"<spec> [random init]"`` etc.).

    Parameters
    ----------
    spec
        An embedded alias (``minilm``, ``smollm2``), a local folder holding a Hugging Face checkpoint, a
        ``.gguf`` file, or a Hugging Face id (``gpt2``, ``bert-base-uncased``; read from the local cache when
        ``HF_HUB_OFFLINE=1``, downloaded otherwise).
    device
        ``auto``, ``cpu``, ``cuda`` or ``mps``.
    dtype
        ``float32`` (default), ``float16``, ``bfloat16`` or ``float64`` (to check a computation without float32 rounding).
    prepend_bos
        For causal models: put the BOS token before each segment, whether or not the tokenizer adds one by
        itself (`HookedModel.token_ids`). None follows TransformerLens' default for the architecture: yes for
        GPT-2 (``<|endoftext|>``), Llama, Mistral and Gemma; no for Pythia, Qwen, Phi and BLOOM; yes on the
        ``hf_hooks`` path. A model without a BOS token gets its EOS token, as in TransformerLens. Encoders
        always get their own [CLS] ... [SEP].
    control
        ``"random-init"``: the same architecture and tokenizer, its weights drawn from the config's own
        initialiser with `control_seed` (`headscan.models.random_init`), hooked by the same path as the trained
        model. ``"shuffled-words"``: the trained model itself, named as the control a sweep runs over the
        corpus with each segment's words permuted (the corpus is the sweep's business).
    """
    device = resolve_device(device)
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}", setting="dtype")
    torch_dtype = DTYPES[dtype]
    found = find_source(spec, torch_dtype)
    hf_model = found.hf_model
    if device_map and hf_model is not None:
        raise ConfigError(f"device_map: {spec!r} is a .gguf file, which loads whole on one device; leave device_map "
                          f"out, or pass a Hugging Face checkpoint", setting="device_map")
    if control not in (None, *CONTROLS):
        raise ConfigError(f"control must be one of {', '.join(CONTROLS)}; got {control!r}", setting="control")
    note = None
    if control == "random-init":
        if device_map:
            raise ConfigError("device_map: a random-init control is built whole on one device; leave device_map out",
                              setting="device_map")
        hf_model = _random_init_control(found, seed=control_seed, dtype=torch_dtype).to(device)
        note = initializer_note(hf_model, control_seed)
    model = _hook(control_name(spec, control), found.target, found.config, device=device, dtype=torch_dtype,
                  prepend_bos=prepend_bos, hf_model=hf_model, tokenizer=found.tokenizer, device_map=device_map,
                  source=found.source, id=found.model_id, revision=found.revision or "unknown")
    if found.source == "huggingface" and model.revision == "unknown":
        model.revision = hf_cache_revision(spec) or "unknown"  # cached by the download just made
    # A checkpoint of a series: the step its revision's or folder's name holds, and a named revision's commit.
    path, named = found.path, found.named
    step = checkpoint_step(named if named is not None else path.name if path is not None else None)
    # of the trained weights: an untrained control's come from the initialiser
    caveat = ALIASES[spec].caveat if found.source == "alias" and control != "random-init" else ""
    model.extra.update(({"step": step} if step is not None else {}) | ({"caveat": caveat} if caveat else {})
                       | ({"commit": path.name} if named is not None else {}))
    if control is not None:
        model.extra.update({"control": control, "control_of": spec, "control_seed": control_seed}
                           | ({"initializer": note} if note else {}))
    return model


def _random_init_control(found: Source, *, seed: int, dtype: torch.dtype):
    """The random-init control of `found`'s model, before it is moved to the device.

    Built here, so that both paths hook it: the bridge's own class where TransformerLens has an adapter (the
    tokenizer then comes as the trained model's does), else AutoModel's; a GGUF's own class. Without an adapter,
    the same class the trained model loads with (its language-model head included).
    """
    if found.hf_model is not None:
        classes = [type(found.hf_model)]
    else:
        classes = [_bridge_class(found.config)] if has_adapter(found.config) else _head_classes(found.target)
    with quiet():
        return _first_that_fits(classes, lambda model_class: random_init(model_class, found.config, seed=seed,
                                                                         dtype=dtype))


def _bridge_class(config):
    """The Hugging Face (Auto) class TransformerLens' bridge loads an architecture with."""
    from transformer_lens.model_bridge.sources.transformers import determine_architecture_from_hf_config
    from transformer_lens.model_bridge.sources.transformers.helpers import get_hf_model_class_for_architecture

    return get_hf_model_class_for_architecture(determine_architecture_from_hf_config(config))

