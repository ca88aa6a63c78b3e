"""Contrastive activation patching: a head's output, or one head's path into another, moved between the runs of a
clean and a corrupted prompt, read as a logit difference.

For a batch of pairs (clean and corrupted prompts of the same length, right-padded; `PairBatch`), with LD the
logit of the answer minus that of the wrong answer at each prompt's last token:

- **denoising** (`patch_heads`): the corrupted run with one head's output z (every position, or one position)
  taken from the clean run; its effect is LD(patched) - LD(corrupted), which, over LD(clean) - LD(corrupted), is
  the fraction of the difference the head restores (Wang et al. 2022; Heimersheim and Nanda 2024 on
  denoising and noising);
- **noising**: the clean run with the head's output from the corrupted one; effect LD(clean) - LD(patched);
- **attribution patching** (AtP, Nanda 2023; Kramár et al. 2024): each of those to first order, for every head
  from one backward pass: sum over positions of (z_other - z) . dLD/dz; and AtP* (`headscan.models.atp_star`:
  GradDrop, L more backward passes), a size per pair against cancellation between a head's paths;
- **path patching** (`patch_paths`, Wang et al. 2022; Goldowsky-Dill et al. 2023): the effect of a sender head on
  a later receiver head through the receiver's queries, keys or values only. Run 1: the corrupted prompt, the
  sender's output from the clean run, every head of the layers after the sender frozen at its corrupted output
  (MLPs and norms recomputed, as Wang et al.), the receiver's query, key or value projection recorded. Run 2:
  the corrupted prompt with only that projection of the receiver replaced by the recorded one, everything
  after it recomputed; the effect is LD(run 2) - LD(corrupted). A grouped-query receiver's key or value is its
  key/value head's, which the other query heads of its group read as well.

Heads are cut where `headscan.models.ablation` cuts them (the output projection's input); queries, keys and
values at the output of the model's own q/k/v projections (before rotary embeddings, which are applied to what
is recorded as to what is replaced). Nothing here writes into a tensor it was handed; no loop runs over heads
inside a pass (one pass per head is the method, not a loop in a metric). This module does not read pairs files
or keep tables (`headscan.scan.patching`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..errors import ModelLoadError
from .ablation import Surgery
from .atp_star import atp_star, head_attributions
from .hooked import PROBE
from .sites import KINDS, PROJECTIONS_SOUGHT

__all__ = ["PairBatch", "PairRuns", "logit_difference", "pair_runs", "patch_heads", "patch_layer", "attributions",
           "patch_paths", "patch_sender", "projection_sites", "Projections", "PATHS"]

PATHS = KINDS  # the receiver's query, key or value


@dataclass
class PairBatch:
    """Clean and corrupted prompts of a batch of pairs, token for token, right-padded."""

    clean: torch.Tensor  # (batch, seq) token ids
    corrupted: torch.Tensor  # (batch, seq)
    mask: torch.Tensor  # (batch, seq) 1 on real tokens, the same for both
    last: torch.Tensor  # (batch,) the last real position, where the answer is read
    answer: torch.Tensor  # (batch,) token id
    wrong: torch.Tensor  # (batch,) token id


def logit_difference(logits: torch.Tensor, batch: PairBatch) -> torch.Tensor:
    """(batch,) logit of the answer minus logit of the wrong answer at each prompt's last position."""
    rows = torch.arange(logits.shape[0], device=logits.device)
    at = logits[rows, batch.last.to(logits.device)].double()  # (batch, vocab); float64 whatever the model ran in
    return at[rows, batch.answer.to(logits.device)] - at[rows, batch.wrong.to(logits.device)]


@dataclass
class PairRuns:
    """The clean and corrupted runs of one batch of pairs: each a `headscan.models.ablation.SurgeryRun` (head outputs
    and block outputs), its LDs (batch,) and, where attribution asked for them, dLD/dz of its heads."""

    clean: object
    corrupted: object
    ld_clean: torch.Tensor
    ld_corrupted: torch.Tensor
    grad_clean: tuple | None = None
    grad_corrupted: tuple | None = None


def pair_runs(surgery: Surgery, batch: PairBatch, *, grad: bool = False) -> PairRuns:
    """The clean and corrupted runs of `batch` and their LDs; with `grad`, dLD/dz of each run's heads."""
    out = {}
    for name, ids in (("clean", batch.clean), ("corrupted", batch.corrupted)):
        run = surgery.run(ids, batch.mask, capture=True, grad=grad)
        ld = logit_difference(run.output, batch)
        grads = torch.autograd.grad(ld.sum(), run.heads) if grad else None
        out[name] = (run, ld.detach(), grads)
    (clean, ld_clean, g_clean), (corrupt, ld_corrupt, g_corrupt) = out["clean"], out["corrupted"]
    return PairRuns(clean, corrupt, ld_clean, ld_corrupt, g_clean, g_corrupt)


def patch_heads(surgery: Surgery, batch: PairBatch, *, n_heads: int, by_position: bool = False,
                attribution: bool = True, only: list[tuple[int, int]] | None = None) -> dict[str, torch.Tensor]:
    """Every head (or the (layer, head) pairs of `only`; the others' exact effects stay 0) patched in both
    directions, exactly and (with `attribution`) to first order.

    Returns float64 CPU tensors: ``clean`` and ``corrupted`` LDs (batch,), and per method an effect (layer,
    batch, head) named ``denoise``, ``noise``, ``atp_denoise``, ``atp_noise`` (and ``atp_star_denoise``,
    ``atp_star_noise``, sizes, where the model's blocks are known); with `by_position` also
    ``denoise_position`` and ``noise_position`` (layer, batch, head, position), the head patched at one position
    alone. Effects are signed so that a head carrying the difference scores positive in both directions.

    The same work in steps a run can keep and resume between: `pair_runs` once per batch, `patch_layer` per
    layer, `attributions` once per batch.
    """
    runs = pair_runs(surgery, batch, grad=attribution)
    n_layers, (b, seq) = len(runs.clean.heads), batch.clean.shape
    chosen = only if only is not None else [(layer, head) for layer in range(n_layers) for head in range(n_heads)]
    out = {f"{method}{suffix}": torch.zeros((n_layers, b, n_heads) + ((seq,) if suffix else ()), dtype=torch.float64)
           for method in ("denoise", "noise") for suffix in ("", "_position")[: 1 + by_position]}
    for layer in sorted({layer for layer, _ in chosen}):
        heads = [head for at, head in chosen if at == layer]
        for name, effect in patch_layer(surgery, runs, batch, layer, heads=heads, n_heads=n_heads,
                                        by_position=by_position).items():
            out[name][layer] = effect
    if attribution:
        out.update(attributions(surgery, runs, batch, n_heads))
    out.update(clean=runs.ld_clean.double().cpu(), corrupted=runs.ld_corrupted.double().cpu())
    return out


def patch_layer(surgery: Surgery, runs: PairRuns, batch: PairBatch, layer: int, *, heads: list[int] | None = None,
                n_heads: int, by_position: bool = False, methods: tuple[str, ...] = ("denoise", "noise"),
                whole: bool = True, step=None) -> dict[str, torch.Tensor]:
    """The exact patches of `heads` (None: every head) of one layer: per method of `methods` an effect (batch,
    head) (unless `whole` is False: by position only), 0 for a head not patched, and with `by_position` (batch,
    head, position) named ``METHOD_position``; float64 CPU. `step(n)`, if given, is called after each head with
    the number of pairs it patched."""
    d = surgery.cut.d_head
    b, seq = batch.clean.shape
    real = batch.mask.bool()
    where = ({"": [None]} if whole else {}) | ({"_position": _one_position(real, seq)} if by_position else {})
    out = {f"{method}{suffix}": torch.zeros((b, n_heads) + ((seq,) if suffix else ()), dtype=torch.float64)
           for method in methods for suffix in where}
    directions = {"denoise": (batch.corrupted, runs.corrupted, runs.clean, runs.ld_corrupted, 1.0),
                  "noise": (batch.clean, runs.clean, runs.corrupted, runs.ld_clean, -1.0)}
    with torch.no_grad():
        for head in range(n_heads) if heads is None else heads:
            cols = slice(head * d, (head + 1) * d)
            for method in methods:
                ids, base, donor, ld_base, sign = directions[method]
                value = donor.heads[layer][..., cols].detach()  # (batch, seq, d_head)
                for suffix, masks in where.items():
                    for p, positions in enumerate(masks):
                        run = surgery.run(ids, batch.mask, replace=(layer, head, value), positions=positions,
                                          residuals=base.residuals)
                        effect = (sign * (logit_difference(run.output, batch) - ld_base)).double().cpu()
                        if suffix:
                            out[method + suffix][:, head, p] = effect
                        else:
                            out[method][:, head] = effect
            if step is not None:
                step(b)
    return out


def attributions(surgery: Surgery, runs: PairRuns, batch: PairBatch, n_heads: int) -> dict[str, torch.Tensor]:
    """AtP of both directions, and AtP* where the model's blocks are known: (layer, batch, head) float64 CPU;
    `runs` made with ``grad=True``."""
    real = batch.mask.bool()
    clean, corrupt = runs.clean, runs.corrupted
    out = {"atp_denoise": _attribution(corrupt.heads, runs.grad_corrupted, clean.heads, real, n_heads),
           "atp_noise": -_attribution(clean.heads, runs.grad_clean, corrupt.heads, real, n_heads)}
    if surgery.cut.blocks is not None and len(clean.heads) > 1:  # GradDrop drops one block's gradient at a time
        out.update(_atp_star(surgery, batch, clean, corrupt, n_heads))
    return out


def _atp_star(surgery: Surgery, batch: PairBatch, clean, corrupt, n_heads: int) -> dict[str, torch.Tensor]:
    """AtP* (GradDrop; `headscan.models.atp_star`) of both directions, (layer, batch, head): a size per pair,
    never negative, to be read against the size of the exact effect."""
    out = {}
    for method, ids, donor in (("atp_star_denoise", batch.corrupted, clean), ("atp_star_noise", batch.clean, corrupt)):
        star = atp_star(surgery, ids, batch.mask, _per_head(donor.heads, n_heads),
                        lambda output: logit_difference(output, batch))
        out[method] = star.star.transpose(0, 1).double().cpu()  # (layer, batch, head)
    return out


def _one_position(real: torch.Tensor, seq: int) -> list[torch.Tensor]:
    """(batch, seq) masks of each single position (where it is real)."""
    eye = torch.eye(seq, dtype=torch.bool, device=real.device)
    return [real & eye[p] for p in range(seq)]


def _per_head(heads: list[torch.Tensor], n_heads: int) -> torch.Tensor:
    """(layer, batch, seq, head, d_head): a run's head outputs, each layer's (batch, seq, head * d_head), stacked."""
    b, n, width = heads[0].shape
    return torch.stack([z.detach().view(b, n, n_heads, width // n_heads) for z in heads])


def _attribution(heads, grads, others, real: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(layer, batch, head): sum over real positions of (z_other - z) . dLD/dz, every head at once."""
    return head_attributions(heads, grads, _per_head(others, n_heads), real).transpose(0, 1).double().cpu()


# --- paths -------------------------------------------------------------------------------------------------------


def projection_sites(surgery: Surgery) -> list[dict[str, tuple[torch.nn.Module, int]]]:
    """Per layer, for "q", "k" and "v": the module whose output holds it and the column where it starts (0 for a
    separate projection; the fused one's thirds). Of the candidates found as the model loaded
    (`headscan.models.sites.LayerSites.projections`), the ones a probe forward pass runs are kept: a bridge holds
    both the model's own fused projection and the split ones it calls instead. A model whose projections headscan
    cannot find is refused."""
    model = surgery.model
    candidates = model.layer_sites.projections
    ran = _modules_run(surgery, {id(m): m for found in candidates for site in found for m, _ in site.values()})
    sites = []
    for layer, found in enumerate(candidates):
        site = next((f for f in found if all(id(m) in ran for m, _ in f.values())), None)
        if site is None:
            raise ModelLoadError(
                f"model {model.name!r} ({type(model.hf_model).__name__}), layer {layer}: headscan cannot find "
                f"query, key and value projections that its forward pass runs (looked for {PROJECTIONS_SOUGHT}), "
                f"so it cannot patch paths; patch heads without --paths")
        sites.append(site)
    return sites


def _modules_run(surgery: Surgery, modules: dict[int, torch.nn.Module]) -> set[int]:
    """Which of `modules` a forward pass on the probe sentence calls."""
    ran: set[int] = set()
    handles = [m.register_forward_hook(lambda module, args, output: ran.add(id(module))) for m in modules.values()]
    ids = torch.tensor([surgery.model.token_ids([PROBE])[0]], dtype=torch.long, device=surgery.model.device)
    try:
        with torch.no_grad():
            surgery.run(ids, torch.ones_like(ids))
    finally:
        for handle in handles:
            handle.remove()
    return ran


class Projections:
    """Forward hooks on every layer's q/k/v projections that record chosen columns or put others in their
    place (use as a context manager, inside the `Surgery`'s)."""

    def __init__(self, sites: list[dict], d_head: int):
        self.sites, self.d_head = sites, d_head
        self.record: set[tuple[int, str]] = set()  # (layer, kind): keep that projection's whole output
        self.recorded: dict[tuple[int, str], torch.Tensor] = {}
        self.replace: dict[tuple[int, str], tuple[int, torch.Tensor]] = {}  # -> (column, (batch, seq, d_head))
        self._handles = []

    def __enter__(self) -> Projections:
        for layer, kinds in enumerate(self.sites):
            by_module: dict[int, list[str]] = {}
            for kind, (module, _) in kinds.items():
                by_module.setdefault(id(module), []).append(kind)
            for kind, (module, _) in kinds.items():
                if by_module[id(module)][0] == kind:  # one hook per module (a fused projection serves all three)
                    self._handles.append(module.register_forward_hook(self._hook(layer, by_module[id(module)])))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, layer: int, kinds: list[str]):
        def hook(module, args, output):
            for kind in kinds:
                if (layer, kind) in self.record:
                    self.recorded[(layer, kind)] = output.detach()
            changes = [self.replace[(layer, kind)] for kind in kinds if (layer, kind) in self.replace]
            if not changes:
                return None
            columns = torch.zeros(output.shape[-1], dtype=torch.bool, device=output.device)
            filler = torch.zeros_like(output)
            for start, value in changes:
                columns[start: start + self.d_head] = True
                filler[..., start: start + self.d_head] = value.to(output.device, output.dtype)
            return torch.where(columns, filler, output)  # a new tensor: `output` is never written into
        return hook

    def column(self, layer: int, kind: str, head: int) -> int:
        """Where (query or key/value) head `head` starts in that projection's output."""
        return self.sites[layer][kind][1] + head * self.d_head


@contextlib.contextmanager
def _recording(projections: Projections, keys):
    projections.record, projections.recorded = set(keys), {}
    try:
        yield projections.recorded
    finally:
        projections.record = set()


def patch_paths(surgery: Surgery, projections: Projections, batch: PairBatch, pairs, kv_group) -> dict:
    """The effect of each (sender, receiver, path) of `pairs` (((layer, head), (layer, head), "q"|"k"|"v"), the
    receiver in a later layer), as LD(run 2) - LD(corrupted) per pair of prompts: {key: (batch,) float64}, with
    ``clean`` and ``corrupted`` LDs. `kv_group(head)` maps a query head to its key/value head. The same work in
    steps: `pair_runs` once per batch, `patch_sender` per sender."""
    with torch.no_grad():
        runs = pair_runs(surgery, batch)
    out = {"clean": runs.ld_clean.double().cpu(), "corrupted": runs.ld_corrupted.double().cpu()}
    for sender in sorted({sender for sender, _, _ in pairs}):
        mine = [(receiver, kind) for s, receiver, kind in pairs if s == sender]
        out.update(patch_sender(surgery, projections, runs, batch, sender, mine, kv_group))
    return out


def patch_sender(surgery: Surgery, projections: Projections, runs: PairRuns, batch: PairBatch, sender, receivers,
                 kv_group, step=None) -> dict:
    """The paths from one `sender` (layer, head) to each (receiver, "q"|"k"|"v") of `receivers`: {(sender,
    receiver, kind): (batch,) float64}. `step(n)`, if given, is called after each path with the batch's pairs."""
    clean, corrupt, ld_corrupt = runs.clean, runs.corrupted, runs.ld_corrupted
    d = surgery.cut.d_head
    n_layers = len(clean.heads)
    layer, head = sender
    out = {}
    with torch.no_grad():
        frozen = [(later, None, corrupt.heads[later].detach()) for later in range(layer + 1, n_layers)]
        replace = [(layer, head, clean.heads[layer][..., head * d: (head + 1) * d].detach()), *frozen]
        wanted = {(r[0], kind) for r, kind in receivers}
        with _recording(projections, wanted) as recorded:
            surgery.run(batch.corrupted, batch.mask, replace=replace, residuals=corrupt.residuals)
        if set(recorded) != wanted:
            raise ModelLoadError(f"model {surgery.model.name!r}: its query, key and value projections were found "
                                 f"but not run in a forward pass, so headscan cannot patch paths in it")
        for receiver, kind in receivers:
            unit = receiver[1] if kind == "q" else int(kv_group(receiver[1]))
            start = projections.column(receiver[0], kind, unit)
            key = (receiver[0], kind)
            projections.replace = {key: (start, recorded[key][..., start: start + d])}
            try:
                run = surgery.run(batch.corrupted, batch.mask, start=receiver[0], residuals=corrupt.residuals)
            finally:
                projections.replace = {}
            out[(tuple(sender), tuple(receiver), kind)] = (logit_difference(run.output, batch) - ld_corrupt).double().cpu()
            if step is not None:
                step(len(batch.last))
    return out
