"""Checkpoint series: a model spec that names a revision, the training step a checkpoint holds, and a folder of
checkpoints named by step read as a list of model specs.

Three ways to name one checkpoint of a training run:

- a Hugging Face id with a revision, ``EleutherAI/pythia-70m@step3000`` (`split_revision`): loaded with that
  revision (`headscan.models.load`), from the local cache when ``HF_HUB_OFFLINE=1``;
- a local folder written by ``save_pretrained``, one per checkpoint;
- ``--checkpoints FOLDER`` (`checkpoint_series`): every checkpoint folder inside FOLDER, in order of step.

The step is read off the revision's or the folder's name (`checkpoint_step`); the accepted names are
``step1000``, ``step-1000``, ``step_1000``, ``checkpoint-1000`` and ``checkpoint_1000`` (`STEP_NAMES`), as
Pythia's revisions, Hugging Face Trainer's ``output_dir`` and most training scripts write them. Each swept
model's provenance records its ``revision`` and ``step`` (None where the name says no step).

This module loads no model and imports no torch; `revision_folder` reads (or fills) the Hugging Face cache.

>>> split_revision("EleutherAI/pythia-70m@step3000"), checkpoint_step("step3000"), checkpoint_step("main")
(('EleutherAI/pythia-70m', 'step3000'), 3000, None)
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError

__all__ = ["STEP_NAMES", "split_revision", "checkpoint_step", "checkpoint_series", "revision_folder"]

STEP_NAMES = "step1000, step-1000, step_1000, checkpoint-1000 or checkpoint_1000"
_STEP = re.compile(r"(?:step[-_]?|checkpoint[-_])(\d+)")


def split_revision(spec: str) -> tuple[str, str | None]:
    """The Hugging Face id and the revision a spec ``ID@REVISION`` names; ``(spec, None)`` without an ``@`` or for
    an existing file or folder (whose name may hold one).

    >>> split_revision("gpt2"), split_revision("org/model@v1.0")
    (('gpt2', None), ('org/model', 'v1.0'))
    """
    if "@" not in spec or Path(spec).expanduser().exists():
        return spec, None
    name, _, revision = spec.rpartition("@")
    if not name or not revision:
        raise ConfigError(f"model {spec!r}: a revision is written ID@REVISION, as EleutherAI/pythia-70m@step3000",
                          setting="models")
    return name, revision


def checkpoint_step(name: str | None) -> int | None:
    """The training step a revision or checkpoint folder's name holds (`STEP_NAMES`), else None.

    >>> [checkpoint_step(n) for n in ("step-1000", "checkpoint-20", "step_5", "step1e3", "final")]
    [1000, 20, 5, None, None]
    """
    if not name:
        return None
    found = _STEP.fullmatch(Path(str(name)).name)
    return int(found.group(1)) if found else None


def checkpoint_series(folder: str | Path) -> list[str]:
    """The checkpoint folders inside `folder`, as model specs in order of step.

    Every sub-folder holding a ``config.json`` must be named by its step (`STEP_NAMES`); other sub-folders and
    files are left alone. A folder without checkpoints, a checkpoint folder named otherwise, or two folders
    with one step is refused with one line naming the folder and the fix.

    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> for name in ("step-20", "step-3", "logs"):
    ...     (root / name).mkdir()
    >>> for name in ("step-20", "step-3"):
    ...     _ = (root / name / "config.json").write_text("{}")
    >>> [Path(spec).name for spec in checkpoint_series(root)]
    ['step-3', 'step-20']
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"checkpoints: {root} is not a folder; pass the folder that holds the checkpoint folders "
                          f"({STEP_NAMES})", setting="checkpoints")
    found: dict[int, Path] = {}
    for child in sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file()):
        step = checkpoint_step(child.name)
        if step is None:
            raise ConfigError(f"checkpoints: {child} holds a checkpoint but its name says no step; name each "
                              f"checkpoint folder {STEP_NAMES}", setting="checkpoints")
        if step in found:
            raise ConfigError(f"checkpoints: {found[step].name} and {child.name} in {root} are both step {step}; "
                              f"keep one", setting="checkpoints")
        found[step] = child
    if not found:
        raise ConfigError(f"checkpoints: {root} holds no checkpoint folders (sub-folders with config.json named "
                          f"{STEP_NAMES}); save each checkpoint with save_pretrained into such a folder",
                          setting="checkpoints")
    return [str(found[step]) for step in sorted(found)]


def revision_folder(model_id: str, revision: str, *, offline: bool) -> Path:
    """The local folder holding `model_id` at `revision`: its snapshot in the Hugging Face cache, downloaded
    first when not `offline` (the whole snapshot, as ``from_pretrained`` would read it). Both hooking paths then
    load it as a local folder, so the revision reaches the bridge and the plain model alike."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from ..errors import ModelNotFoundError

    try:
        return Path(snapshot_download(model_id, revision=revision, local_files_only=offline))
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(
            f"model {model_id!r} at revision {revision!r} is not in the local Hugging Face cache (HF_HUB_OFFLINE "
            f"is set); download it once where there is a network (python -c \"from huggingface_hub import "
            f"snapshot_download; snapshot_download('{model_id}', revision='{revision}')\")") from None
    except Exception as error:  # the hub raises many kinds (no such revision, no such repository, no network)
        first = (str(error).strip().splitlines() or [""])[0]
        raise ModelNotFoundError(f"model {model_id!r} at revision {revision!r}: {type(error).__name__}: "
                                 f"{first[:160]}") from None
