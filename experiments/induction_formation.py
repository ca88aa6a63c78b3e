"""Induction formation: a two-layer attention-only transformer, trained here on the CPU, grows a previous-token
head and then an induction head, and headscan's own tables over its checkpoints show when.

Claim (Olsson et al. 2022, "In-context Learning and Induction Heads"): in a two-layer attention-only
transformer, a previous-token head forms in layer 0 and then an induction head in layer 1, which attends to the
token after an earlier occurrence of the current token; as it forms, the loss on tokens that repeat earlier
context drops ("phase change"), and the in-context gap (loss on tokens the context cannot predict less loss on
those it can) opens.

Setup. `headscan.testing.training.train_series` trains Hugging Face's GPT-NeoX (Pythia's architecture, rotary
positions) with its MLPs switched off (each MLP one unit wide, its output projection zero and frozen: attention
only), 2 layers x 4 heads, width 64, vocabulary 128, on sequences of BOS then a random run of 4 to 16 tokens
repeated to 64 tokens (the run length varies, so no fixed offset predicts the repeats), saving ``step-N``
checkpoints every 10 steps up to 400, then every 100. headscan
then sweeps the series (``headscan.sweep`` over `checkpoint_series`, the library, no subprocess) over
``repeat-random:n=25,count=48`` (25 random tokens repeated twice after BOS, Olsson et al.'s length) with 95%
bootstrap intervals over segments, and `headscan.analysis.series.formation` finds the step at which each head
forms: the first step whose interval's low end is at or above the role's threshold (prev_token 0.5, induction
0.4) and above chance, holding at the next two checkpoints.

    OMP_NUM_THREADS=2 python experiments/induction_formation.py

Writes ``reports/experiments/induction_formation/``: README.md (the steps, intervals, losses and times),
induction_formation.png, formation.csv (each head's formation step per metric), trajectories.csv (prev_token and
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

import headscan  # noqa: E402
from headscan.analysis.series import checkpoint_steps, formation, formation_rule, with_steps  # noqa: E402
from headscan.models.series import checkpoint_series  # noqa: E402
from headscan.plots.series import trajectories  # noqa: E402
from headscan.testing.training import TrainConfig, train_series  # noqa: E402
from _common import markdown_table, out_folder, verdict  # noqa: E402

CORPUS = "repeat-random:n=25,count=48"


def schedule(steps: int) -> tuple[int, ...]:
    """Every 10 steps up to 400 (where the heads form), every 100 after."""
    return tuple(sorted({*range(0, min(steps, 400) + 1, 10), *range(0, steps + 1, 100), steps}))


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=800, help="optimiser steps (default 800)")
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
    formed = formation(rows, metrics=["prev_token", "induction"])
    return {"config": config, "log": pd.DataFrame(log), "rows": rows, "formed": formed, "tables": tables,
            "seconds": {"train": trained - started, "sweep": swept - trained, "total": swept - started}}


def first(formed: pd.DataFrame, metric: str, layer: int | None = None) -> pd.Series | None:
    part = formed[(formed["metric"] == metric) & formed["step"].notna()]
    if layer is not None:
        part = part[part["layer"] == layer]
    return part.sort_values(["step", "ci_low"], ascending=[True, False]).iloc[0] if len(part) else None


def figure(result: dict, path: Path) -> None:
    rows, formed, log = result["rows"], result["formed"], result["log"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    trajectories(rows, metric="prev_token", formed=formed, threshold=0.5, ax=axes[0],
                 title="previous-token score per head")
    trajectories(rows, metric="induction", formed=formed, threshold=0.4, ax=axes[1],
                 title="induction (prefix-matching) score per head", legend=False)
    ax = axes[2]
    ax.plot(log["step"], log["train_loss"], label="training loss", color="black")
    ax.plot(log["step"], log["repeat_loss"], label="loss on repeated tokens", color="#d55e00")
    ax.plot(log["step"], log["first_loss"], label="loss on first-copy tokens", color="0.6")
    ax.plot(log["step"], log["icl_gap"], label="in-context gap (first - repeated)", color="#0173b2", linestyle="--")
    ax.set_xlabel("training step")
    ax.set_ylabel("nats")
    ax.set_title("loss")
    ax.legend(fontsize="x-small")
    induction = first(formed, "induction", layer=1)
    for axis in axes:
        if induction is not None:
            axis.axvline(induction["step"], color="#d55e00", alpha=0.3, linewidth=4)
    fig.suptitle("A two-layer attention-only transformer over training (shaded: the first layer-1 induction head "
                 "forms)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def describe(head: pd.Series | None, what: str) -> str:
    if head is None:
        return f"no {what} forms by the rule"
    return (f"{head['label']} at step {int(head['step'])}: {head['value']:.3f} [{head['ci_low']:.3f}, "
            f"{head['ci_high']:.3f}], chance {head['chance']:.3f}")


def loss_at(log: pd.DataFrame, step: float, column: str) -> float:
    return float(log.loc[log["step"] == step, column].iloc[0])


def main(argv=None) -> int:
    args = parse(argv)
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
    ok = prev is not None and induction is not None and induction["step"] >= prev["step"]
    figure(result, out / "induction_formation.png")
    formed.to_csv(out / "formation.csv", index=False)
    result["rows"][result["rows"]["metric"].isin(["prev_token", "induction"])][
        ["model", "step", "layer", "head", "label", "metric", "value", "ci_low", "ci_high", "chance"]].to_csv(
        out / "trajectories.csv", index=False, float_format="%.6g")
    log.to_csv(out / "training.csv", index=False, float_format="%.6g")
    lines = [f"{verdict(ok)}: previous-token head in layer 0: {describe(prev, 'previous-token head')}; "
             f"induction head in layer 1: {describe(induction, 'induction head')}"]
    losses = []
    if induction is not None:
        at = induction["step"]
        before = log[log["step"] < at]["step"].max() if (log["step"] < at).any() else at
        losses = [("before (step %d)" % before, before), ("formed (step %d)" % at, at),
                  ("end (step %d)" % log["step"].max(), log["step"].max())]
        lines.append("loss on repeated tokens: " + ", ".join(
            f"{name} {loss_at(log, s, 'repeat_loss'):.3f}" for name, s in losses)
            + "; in-context gap: " + ", ".join(f"{name} {loss_at(log, s, 'icl_gap'):.3f}" for name, s in losses))
    lines.append(f"time: training {seconds['train']:.0f} s, sweep of {len(result['log'])} checkpoints "
                 f"{seconds['sweep']:.0f} s, total {seconds['total']:.0f} s; load average {load[0]:.1f} before, "
                 f"{load_after[0]:.1f} after, torch threads {__import__('torch').get_num_threads()}")
    for line in lines:
        print(line)
    heads = formed[formed["step"].notna()].sort_values(["step", "metric", "layer", "head"])
    table = heads[["label", "metric", "role", "step", "value", "ci_low", "ci_high", "chance"]].assign(
        step=heads["step"].astype(int))
    config = result["config"]
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
Rule: {formation_rule()} Thresholds are the roles' (`headscan.analysis.roles`): previous-token 0.5, induction 0.4.
`induction` here reads the attention pattern alone (Olsson et al.'s prefix-matching score, on the second copy's
queries); copying is not tested. Numbers are value [95% interval], and chance is what uniform attention over the
keys each query sees would score on the same queries.

![previous-token and induction scores per head against the step, and the losses](induction_formation.png)

Every head that forms, by the rule above:

{markdown_table(table) if len(table) else "(none)"}

Reproduce: `OMP_NUM_THREADS=2 python experiments/induction_formation.py` (offline; the checkpoints and the sweep go
to a temporary folder unless `--work`). `trajectories.csv` holds every head's scores at every step with their
intervals, `training.csv` the losses at each checkpoint (training loss: the mean over the steps since the previous
checkpoint; the others on a fixed evaluation batch of {config.eval_size} sequences), `formation.csv` each head's
formation step per metric.
"""
    (out / "README.md").write_text(text, encoding="utf-8")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
