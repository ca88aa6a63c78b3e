"""Induction formation: a two-layer attention-only transformer, trained here on the CPU, grows previous-token
heads in layer 0 and induction heads in layer 1 as its loss on repeated tokens drops, and headscan's own tables
over its checkpoints say at which step.

Claim (Olsson et al. 2022, "In-context Learning and Induction Heads"): in a two-layer attention-only
transformer, previous-token heads form in layer 0 and induction heads in layer 1 (which attend to the token
after an earlier occurrence of the current token, through the layer-0 head's output), in a narrow window of
training where the loss on tokens that repeat earlier context drops (the "phase change") and the in-context gap
(loss on tokens the context cannot predict less loss on those it can) opens. Verdict: PASS when a layer-0
previous-token head and a layer-1 induction head both form within that window (the checkpoints at which the
loss on repeated tokens fell, per 10 steps, by more than a tenth of its whole fall, as Olsson et al. read the
window off the loss's derivative), widened by 20 steps on each side (the formation rule's threshold may be
reached after the fastest fall; two checkpoints at the 10-step spacing). Which of the two forms first is
reported, not assumed, in two ways: by the formation rule, and by half rise
(`headscan.analysis.series.half_rise`: when each head has done half of its own rise, which no role threshold
enters, so a weak head that ends at 0.3 and a strong one that ends at 0.9 compare).

Setup. `headscan.testing.training.train_series` trains Hugging Face's GPT-NeoX (Pythia's architecture, rotary
positions) with its MLPs switched off (each MLP one unit wide, its output projection zero and frozen: attention
only), 2 layers x 4 heads, width 64, vocabulary 128, on sequences of BOS then a random run of 4 to 16 tokens
repeated to 64 tokens (the run length varies, so no fixed offset predicts the repeats), saving ``step-N``
checkpoints every 2 steps from 150 to 260, every 10 steps elsewhere up to 400, then every 100. The dense window
was chosen from a first run at 10-step spacing, in which the loss on repeated tokens fell between steps 180 and
200 and the first heads formed at 200 and 210; 2 steps resolve the order there. headscan then sweeps the
series (``headscan.sweep`` over `checkpoint_series`, the library, no subprocess) over
``repeat-random:n=25,count=48`` (25 random tokens repeated twice after BOS, Olsson et al.'s length) with 95%
bootstrap intervals over segments, and `headscan.analysis.series.formation` finds the step at which each head
forms: the first step whose interval's low end is at or above the role's threshold (prev_token 0.5, induction
0.4) and above chance, holding at the next two checkpoints; `half_rise` finds the first step whose interval's
low end is past half-way from the head's first value to its last.

    python experiments/induction_formation.py

Writes ``reports/experiments/induction_formation/``: README.md (the steps, intervals, losses and times),
induction_formation.png, formation.csv (each head's formation step per metric), half_rise.csv (each head's
half-rise step per metric), trajectories.csv (prev_token and
induction per head and step with intervals) and training.csv (the losses at each checkpoint). The checkpoints and
the sweep go to ``--work`` (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from _common import markdown_table, out_folder, verdict  # noqa: E402

import headscan  # noqa: E402
from headscan.analysis.series import checkpoint_steps, formation, formation_rule, half_rise, half_rise_rule, with_steps  # noqa: E402
from headscan.models.series import checkpoint_series  # noqa: E402
from headscan.plots.series import trajectories  # noqa: E402
from headscan.testing.training import TrainConfig, train_series  # noqa: E402

CORPUS = "repeat-random:n=25,count=48"
DENSE = (150, 260)  # checkpoints every 2 steps here: a first run at 10-step spacing saw the fall at 180 to 200
SLACK = 20  # steps the phase change is widened by on each side for the verdict


def schedule(steps: int) -> tuple[int, ...]:
    """Every 2 steps in `DENSE`, every 10 elsewhere up to 400, every 100 after, and the last step.

    >>> points = schedule(500)
    >>> len(points), points[14:19], points[-3:]
    (86, (140, 150, 152, 154, 156), (390, 400, 500))
    """
    return tuple(sorted({*range(0, min(steps, 400) + 1, 10), *range(DENSE[0], min(steps, DENSE[1]) + 1, 2),
                         *range(0, steps + 1, 100), steps}))


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="optimiser steps (default 500)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: on 2 shared cores one thread trained 3x faster than two)")
    parser.add_argument("--work", default=None, help="where the checkpoints and the sweep go (default: a temporary "
                                                      "folder, removed at the end)")
    parser.add_argument("--out", default=None, help="default: reports/experiments/induction_formation")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates of the sweep (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def run(work: Path, args) -> dict:
    config = TrainConfig(steps=args.steps, save_at=schedule(args.steps), seed=args.seed)
    started = time.perf_counter()
    log = train_series(work / "series", config, progress=lambda r: print(
        f"step {r['step']:5d}: train loss {r['train_loss']:.3f}, repeated-token loss {r['repeat_loss']:.3f}, "
        f"in-context gap {r['icl_gap']:.3f}", flush=True))
    trained = time.perf_counter()
    tables = headscan.sweep(checkpoint_series(work / "series"), CORPUS, out=work / "sweep", max_len=64,
                            bootstrap=args.bootstrap, seed=args.seed)
    swept = time.perf_counter()
    steps = checkpoint_steps(tables.provenance.models)
    rows = with_steps(tables.heads, steps)
    rows["model"] = [name.removeprefix(f"{work}/") for name in rows["model"]]  # series/step-N, not this machine's path
    formed = formation(rows, metrics=["prev_token", "induction"])
    halves = half_rise(rows, metrics=["prev_token", "induction"])
    return {"config": config, "log": pd.DataFrame(log), "rows": rows, "formed": formed, "halves": halves,
            "tables": tables,
            "seconds": {"train": trained - started, "sweep": swept - trained, "total": swept - started}}


def first(formed: pd.DataFrame, metric: str, layer: int | None = None) -> pd.Series | None:
    part = formed[(formed["metric"] == metric) & formed["step"].notna()]
    if layer is not None:
        part = part[part["layer"] == layer]
    return part.sort_values(["step", "ci_low"], ascending=[True, False]).iloc[0] if len(part) else None


def drop_window(log: pd.DataFrame) -> tuple[int, int]:
    """The phase change, read off the loss as Olsson et al. read it off its derivative: the first and last
    checkpoints at which the loss on repeated tokens, since the checkpoint before, fell at a rate of more than a
    tenth of its whole fall (step 0 to the end) per 10 steps. A rate, so that 2- and 10-step checkpoints compare.

    >>> log = pd.DataFrame({"step": [0, 10, 20, 22, 24, 26, 36], "repeat_loss": [5.0, 5.0, 5.0, 4.8, 0.2, 0.0, 0.0]})
    >>> drop_window(log)  # at 22 and 26, 0.2 in 2 steps is 1.0 per 10 steps: above a tenth of the fall, 0.5
    (22, 26)
    """
    fall = log["repeat_loss"].iloc[0] - log["repeat_loss"].iloc[-1]
    rate = -log["repeat_loss"].diff() / log["step"].diff() * 10  # fall per 10 steps since the checkpoint before
    steep = log.loc[rate > fall / 10, "step"]
    return (int(steep.min()), int(steep.max())) if len(steep) else (int(log["step"].iloc[-1]),) * 2


def figure(result: dict, window: tuple[int, int], path: Path) -> None:
    """Top row: the whole run; bottom row: the dense window, each circuit head's half rise marked."""
    rows, formed, log = result["rows"], result["formed"], result["log"]
    halves = circuit(result["halves"], formed).dropna(subset=["step"])
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for row, zoom in enumerate((False, True)):
        for ax, metric, threshold, name in ((axes[row, 0], "prev_token", 0.5, "previous-token score per head"),
                                            (axes[row, 1], "induction", 0.4,
                                             "induction (prefix-matching) score per head")):
            title = f"{metric}, steps {DENSE[0]}-{DENSE[1]} (x: half rise)" if zoom else name
            trajectories(rows, metric=metric, formed=formed, threshold=threshold, ax=ax, title=title,
                         legend=not zoom and metric == "prev_token")
            if zoom:
                mine = halves[halves["metric"] == metric]
                ax.scatter(mine["step"], mine["value"], marker="x", s=40, color="black", zorder=6)
        ax = axes[row, 2]
        ax.plot(log["step"], log["train_loss"], label="training loss", color="black")
        ax.plot(log["step"], log["repeat_loss"], label="loss on repeated tokens", color="#d55e00")
        ax.plot(log["step"], log["first_loss"], label="loss on first-copy tokens", color="0.6")
        ax.plot(log["step"], log["icl_gap"], label="in-context gap (first - repeated)", color="#0173b2",
                linestyle="--")
        ax.set_xlabel("training step")
        ax.set_ylabel("nats")
        ax.set_title("loss" + (f" (steps {DENSE[0]}-{DENSE[1]})" if zoom else ""))
        if not zoom:
            ax.legend(fontsize="x-small")
        if zoom:
            for axis in axes[row]:
                axis.set_xlim(*DENSE)
    before = log.loc[log["step"] < window[0], "step"].max()  # the fall starts after the checkpoint before
    for axis in axes.ravel():
        axis.axvspan(before if pd.notna(before) else window[0], window[1], color="#e69f00", alpha=0.2, linewidth=0)
    fig.suptitle("A two-layer attention-only transformer over training (shaded: the phase change, where the loss on "
                 "repeated tokens falls fastest)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def describe(head: pd.Series | None, what: str) -> str:
    if head is None:
        return f"no {what} forms by the rule"
    return (f"{head['label']} at step {int(head['step'])}: {head['value']:.3f} [{head['ci_low']:.3f}, "
            f"{head['ci_high']:.3f}], chance {head['chance']:.3f}")


def circuit(halves: pd.DataFrame, formed: pd.DataFrame) -> pd.DataFrame:
    """The half rises of the circuit's heads (previous-token scores in layer 0, induction scores in layer 1) in
    half-rise order, heads that never rise last, each with the step it forms at by the rule (``formed``)."""
    keys = ["series", "layer", "head", "metric"]
    part = halves[((halves["metric"] == "prev_token") & (halves["layer"] == 0))
                  | ((halves["metric"] == "induction") & (halves["layer"] == 1))]
    part = part.merge(formed[[*keys, "step"]].rename(columns={"step": "formed"}), on=keys, how="left")
    return part.sort_values(["step", "layer", "head"], na_position="last", kind="stable").reset_index(drop=True)


def who_moves_first(order: pd.DataFrame, window: tuple[int, int]) -> list[str]:
    """Sentences on the order of half rises (`circuit`'s table), every number from it; `window` is the phase
    change's first and last step as the README states them."""
    name = {"prev_token": "previous-token", "induction": "induction"}
    rising = order.dropna(subset=["step"])
    if rising.empty:
        return ["by half rise: no head of either circuit rises (its last interval above its first)"]

    def heads(part):
        return ", ".join(f"{r.label} {int(r.step)} ({r.start:.2f} to {r.final:.2f})" for r in part.itertuples())

    lines = [f"half rise, {name[m]} scores of layer {0 if m == 'prev_token' else 1}: "
             + (heads(rising[rising["metric"] == m]) or "none rises")
             for m in ("prev_token", "induction")]
    firsts = {m: rising[rising["metric"] == m].head(1) for m in ("prev_token", "induction")}
    if all(len(f) for f in firsts.values()):
        prev, ind = (firsts[m].iloc[0] for m in ("prev_token", "induction"))
        if prev["step"] == ind["step"]:
            lines.append(f"by half rise the two circuits start together: {prev['label']}'s previous-token and "
                         f"{ind['label']}'s induction scores both pass half their rise at step {int(prev['step'])}")
        else:
            one, other = (prev, ind) if prev["step"] < ind["step"] else (ind, prev)
            lines.append(f"by half rise the {name[one['metric']]} scores move first: {one['label']} at step "
                         f"{int(one['step'])} (it ends at {one['final']:.2f}), the first {name[other['metric']]} "
                         f"head {other['label']} {int(other['step'] - one['step'])} steps later, at "
                         f"{int(other['step'])}")
    strong = rising[rising["formed"].notna()]
    if len(strong):
        lines.append("of the heads that form by the rule, half rise: " + ", ".join(
            f"{name[r.metric]} {r.label} {int(r.step)} (forms at {int(r.formed)})" for r in strong.itertuples()))
        firsts = {m: strong[strong["metric"] == m].head(1) for m in ("prev_token", "induction")}
        if all(len(f) for f in firsts.values()):
            prev, ind = (firsts[m].iloc[0] for m in ("prev_token", "induction"))
            one, other = (prev, ind) if prev["step"] <= ind["step"] else (ind, prev)
            lines.append(f"so among the heads that form, the first {name[one['metric']]} head passes half its rise "
                         f"at step {int(one['step'])} ({one['label']}) and the first {name[other['metric']]} head "
                         f"at {int(other['step'])} ({other['label']}), {int(other['step'] - one['step'])} steps apart")
    inside = rising[rising["step"].between(*window)]
    outside = rising[~rising["step"].between(*window)]
    lines.append(f"{len(inside)} of the {len(rising)} rising heads of the two circuits pass half their rise inside "
                 f"the phase change (steps {window[0]} to {window[1]})"
                 + (f", between steps {int(inside['step'].min())} and {int(inside['step'].max())}" if len(inside)
                    else "")
                 + ("; outside it: " + ", ".join(f"{r.label} {int(r.step)}" for r in outside.itertuples())
                    if len(outside) else ""))
    return lines


def loss_at(log: pd.DataFrame, step: float, column: str) -> float:
    return float(log.loc[log["step"] == step, column].iloc[0])


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    out = out_folder("induction_formation", args.out)
    load = os.getloadavg()
    if args.work:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        result = run(work, args)
    else:
        with tempfile.TemporaryDirectory() as folder:
            result = run(Path(folder), args)
    load_after = os.getloadavg()
    formed, log, seconds = result["formed"], result["log"], result["seconds"]
    prev, induction = first(formed, "prev_token", layer=0), first(formed, "induction", layer=1)
    window = drop_window(log)
    near = [head is not None and window[0] - SLACK <= head["step"] <= window[1] + SLACK for head in (prev, induction)]
    ok = all(near)
    figure(result, window, out / "induction_formation.png")
    formed.to_csv(out / "formation.csv", index=False)
    result["halves"].to_csv(out / "half_rise.csv", index=False, float_format="%.6g")
    by_half = circuit(result["halves"], formed)
    result["rows"][result["rows"]["metric"].isin(["prev_token", "induction"])][
        ["model", "step", "layer", "head", "label", "metric", "value", "ci_low", "ci_high", "chance"]].to_csv(
        out / "trajectories.csv", index=False, float_format="%.6g")
    log.to_csv(out / "training.csv", index=False, float_format="%.6g")
    lines = [f"{verdict(ok)}: previous-token head in layer 0: {describe(prev, 'previous-token head')}; "
             f"induction head in layer 1: {describe(induction, 'induction head')}"]
    if prev is not None and induction is not None:
        order = ("the previous-token head first" if prev["step"] < induction["step"] else
                 "both at the same checkpoint" if prev["step"] == induction["step"] else
                 "the induction head first")
        lines.append(f"order by the rule: {order}")
    before = log.loc[log["step"] < window[0], "step"].max()
    before = int(before) if pd.notna(before) else window[0]
    losses = [(f"step {before}", before), (f"step {window[1]}", window[1]), (f"end (step {int(log['step'].max())})",
                                                                            int(log["step"].max()))]
    lines.extend(who_moves_first(by_half, (before, window[1])))
    lines.append(f"phase change (the loss on repeated tokens falls by more than a tenth of its whole fall per 10 "
                 f"steps): steps {before} to {window[1]}; loss on repeated tokens "
                 + ", ".join(f"{name} {loss_at(log, at, 'repeat_loss'):.3f}" for name, at in losses)
                 + "; in-context gap " + ", ".join(f"{name} {loss_at(log, at, 'icl_gap'):.3f}" for name, at in losses)
                 + "; training loss " + ", ".join(f"{name} {loss_at(log, at, 'train_loss'):.3f}"
                                                  for name, at in losses))
    lines.append(f"time: training {seconds['train']:.0f} s, sweep of {len(result['log'])} checkpoints "
                 f"{seconds['sweep']:.0f} s, total {seconds['total']:.0f} s; load average {load[0]:.1f} before, "
                 f"{load_after[0]:.1f} after, torch threads {torch.get_num_threads()}")
    for line in lines:
        print(line)
    heads = formed[formed["step"].notna()].sort_values(["step", "metric", "layer", "head"])
    table = heads[["label", "metric", "role", "step", "value", "ci_low", "ci_high", "chance"]].assign(
        step=heads["step"].astype(int))
    config = result["config"]
    shown = by_half[["label", "metric", "start", "final", "level", "step", "ci_low", "formed"]].rename(
        columns={"step": "half_rise"})
    for column in ("half_rise", "formed"):  # steps as integers, blank where none
        shown[column] = [f"{step:.0f}" if pd.notna(step) else "" for step in shown[column]]
    text = f"""# Induction formation

{verdict(ok)}. A two-layer attention-only transformer (Hugging Face GPT-NeoX, Pythia's architecture with rotary
positions, each MLP one unit wide and its output projection zero and frozen; {config.n_layers} layers x
{config.n_heads} heads, width {config.d_model}, vocabulary {config.vocab}), trained
here on the CPU for {config.steps} steps of {config.batch_size} sequences (BOS, then a random run of
{config.run_min}-{config.run_max} tokens repeated to {config.seq_len} tokens; AdamW, learning rate {config.lr:g},
{config.warmup} warm-up steps, seed {config.seed}), saved at {len(config.save_at)} steps and swept by headscan over
`{CORPUS}` with {args.bootstrap} bootstrap replicates over segments.

- First previous-token head in layer 0: {describe(prev, 'previous-token head')}.
- First induction head in layer 1: {describe(induction, 'induction head')}.
""" + "".join(f"- {line}\n" for line in lines[1:]) + f"""
Verdict: PASS when a layer-0 previous-token head and a layer-1 induction head both form within the phase change
widened by {SLACK} steps on each side. Rule: {formation_rule()}
Thresholds are the roles' (`headscan.analysis.roles`): previous-token 0.5, induction 0.4
(Olsson et al.'s prefix-matching score, on the second copy's queries; copying is not tested). Numbers are
value [95% interval]; chance is what uniform attention over the keys each query sees would score on the same
queries. The phase change is shaded in the figure.

Half rise (`headscan.analysis.series.half_rise`): {half_rise_rule()} It orders heads by when they move, whatever
value they end at. The dense checkpoints (every 2 steps from {DENSE[0]} to {DENSE[1]}; every 10 elsewhere to
400) were placed from a first run at 10-step spacing, in which the loss on repeated tokens fell between steps
180 and 200.

![previous-token and induction scores per head against the step, and the losses](induction_formation.png)

Every head that forms, by the rule above:

{markdown_table(table) if len(table) else "(none)"}

The circuit's heads (previous-token scores in layer 0, induction scores in layer 1) in half-rise order
(`half_rise` is the step; `ci_low` is its interval's low end there; `formed` the step by the rule, blank if never):

{markdown_table(shown) if len(shown) else "(none)"}

Reproduce: `python experiments/induction_formation.py` (offline; the checkpoints and the sweep go
to a temporary folder unless `--work`). `trajectories.csv` holds every head's scores at every step with their
intervals, `half_rise.csv` every head's half rise per metric, `training.csv` the losses at each checkpoint
(training loss: the mean over the steps since the previous checkpoint; the others on a fixed evaluation batch
of {config.eval_size} sequences), `formation.csv` each head's formation step per metric.
"""
    (out / "README.md").write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
