"""What a model spec names, found without loading the model: checks that run before a sweep starts, and
`describe_spec` for ``headscan models SPEC``.

A spec is an embedded alias, a local checkpoint folder, a ``.gguf`` file, or a Hugging Face id, with a revision
as ``ID@REVISION`` (read from the local cache when ``HF_HUB_OFFLINE=1``; `headscan.models.series`). The small
helpers `headscan.models` shares for messages and quiet loading are `headscan.models.hub`.
"""

from __future__ import annotations

from pathlib import Path

from ..config import hf_offline, split_control
from ..errors import ModelNotFoundError
from .aliases import ALIASES, alias_status
from .hub import architecture_name, has_adapter, hf_cache_revision, one_line, quiet

__all__ = ["check_spec", "describe_spec", "describe_models"]

# What `describe_models` says a control is, before its architecture.
CONTROL_WHAT = {"random-init": "a control with untrained weights drawn from the config's initialiser: ",
                "shuffled-words": "the model, as a control swept over each segment's words permuted: "}


def describe_models(specs: str | list[str] | tuple[str, ...] = ()) -> str:
    """What ``headscan models [SPEC]...`` prints: with no `specs`, the embedded aliases (each installed or how to
    install it) and the controls a sweep can add; else one line per spec: its architecture and the path its
    attention is read through (`describe_spec`, from its config alone).

    The embedded model may not be installed where the docs are tested, hence the skip:

    >>> print(describe_models("minilm"))  # doctest: +SKIP
    minilm: BertModel (bert), hooked through transformer_lens
    """
    specs = [specs] if isinstance(specs, str) else list(specs)
    if specs:
        return "\n".join(f"{spec}: {CONTROL_WHAT.get(found['control'], '')}{found['architecture']} "
                         f"({found['model_type']}), hooked through {found['path']}"
                         for spec, found in ((spec, describe_spec(spec)) for spec in specs))
    lines = []
    for name, path in alias_status().items():
        alias = ALIASES[name]
        state = f"installed: {path}" if path else f"not installed ({alias.install})"
        lines.append(f"{name:8} {alias.description}\n         {state}")
    lines.append("controls: sweep --control random-init adds 'MODEL [random init]' (its architecture and tokenizer, "
                 "untrained weights), --control shuffled-words 'MODEL [shuffled words]' (the model over the corpus "
                 "with each segment's words permuted)")
    return "\n".join(lines)


def describe_spec(spec: str) -> dict:
    """Architecture, model type and hooking path of `spec`, from its config alone (no weights are loaded), and
    which control of its model it is (``control``: None for a model itself, as in ``"minilm [random init]"``).

    The path is the one `load_model` tries first: ``transformer_lens`` where TransformerLens has an adapter,
    else ``hf_hooks``; a model the bridge then fails on still falls back to ``hf_hooks`` when loaded. A control
    takes its model's path.
    """
    from transformers import AutoConfig

    from .series import revision_folder, split_revision

    spec, control = split_control(spec)
    check_spec(spec)
    hub_id, revision = split_revision(spec)
    target = ALIASES[spec].locate() if spec in ALIASES else Path(spec).expanduser() if revision is None else \
        revision_folder(hub_id, revision, offline=hf_offline())
    try:
        with quiet():
            if target.suffix == ".gguf":
                config = AutoConfig.from_pretrained(target.parent, gguf_file=target.name)
            else:
                config = AutoConfig.from_pretrained(target if target.exists() else spec)
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"model {spec!r}: no readable config ({one_line(error, 120)})") from None
    return {"architecture": architecture_name(config), "model_type": getattr(config, "model_type", None),
            "path": "transformer_lens" if has_adapter(config) else "hf_hooks", "control": control, "model": spec}


def check_spec(spec: str) -> None:
    """Check, without loading anything, that `spec` names a model that can be found; raise one clear line if not.

    Run on every model before a sweep starts, so that a misspelt second model does not waste the first one's
    work. Aliases must be installed, paths must hold a checkpoint, and offline a Hugging Face id must be in
    the local cache; a name close to an alias gets "did you mean".
    """
    import difflib

    if spec in ALIASES:
        if alias_status()[spec] is None:
            raise ModelNotFoundError(f"embedded model {spec!r} is not installed; install it with: {ALIASES[spec].install}")
        return
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file():
            raise ModelNotFoundError(f"{path}: a local model folder needs config.json and the weights "
                                     f"(a folder written by save_pretrained), or pass a .gguf file")
        return
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec:
        raise ModelNotFoundError(f"{spec}: no such file or folder; pass a checkpoint folder, a .gguf file, an "
                                 f"embedded alias ({', '.join(ALIASES)}) or a Hugging Face id (org/name)")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from .series import split_revision

    hub_id, revision = split_revision(spec)
    try:
        validate_repo_id(hub_id)
    except HFValidationError:
        raise ModelNotFoundError(f"model {spec!r} not found: no embedded alias ({', '.join(ALIASES)}), no file or "
                                 f"folder of that name, and not a Hugging Face id (org/name: letters, digits, '-', "
                                 f"'_' and '.', at most 96 characters)") from None
    if revision is not None:  # ID@REVISION: offline, that revision must be in the cache
        if hf_offline() and hf_cache_revision(hub_id, revision) is None:
            raise ModelNotFoundError(
                f"model {spec!r}: revision {revision!r} of {hub_id!r} is not in the local Hugging Face cache "
                f"(HF_HUB_OFFLINE is set); download it once where there is a network (python -c \"from "
                f"huggingface_hub import snapshot_download; snapshot_download('{hub_id}', revision='{revision}')\")")
        return
    close = difflib.get_close_matches(spec, ALIASES, n=1, cutoff=0.7)
    if hf_offline() and hf_cache_revision(spec) is None:
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ModelNotFoundError(f"model {spec!r} not found: no embedded alias, local path or cached Hugging Face "
                                 f"model of that name (HF_HUB_OFFLINE is set).{hint} Aliases: {', '.join(ALIASES)}")
    if close and "/" not in spec and hf_cache_revision(spec) is None:
        raise ModelNotFoundError(f"model {spec!r} is not an embedded alias. Did you mean {close[0]!r}? "
                                 f"(A Hugging Face id with that name would be downloaded; pass it as org/name.)")
