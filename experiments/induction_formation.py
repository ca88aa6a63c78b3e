"""Induction formation: a two-layer attention-only transformer, trained here on the CPU, grows previous-token
heads in layer 0 and induction heads in layer 1 as its loss on repeated tokens drops, and headscan's own tables
over its checkpoints say at which step.

Claim (Olsson et al. 2022, "In-context Learning and Induction Heads"): in a two-layer attention-only
transformer, previous-token heads form in layer 0 and induction heads in layer 1 (which attend to the token
after an earlier occurrence of the current token, through the layer-0 head's output), in a narrow window of
training where the loss on tokens that repeat earlier context drops (the "phase change") and the in-context gap
(loss on tokens the context cannot predict less loss on those it can) opens. Verdict: PASS when a layer-0
previous-token head and a layer-1 induction head both form within that window (the checkpoints at which the
loss on repeated tokens fell by more than a tenth of its whole fall since the checkpoint before, as Olsson et
al. read the window off the loss's derivative), widened by the two checkpoints (20 steps) the formation rule
may lag. Which of the two forms first is reported, not assumed.

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

    python experiments/induction_formation.py

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
import torch  # noqa: E402

import headscan  # noqa: E402
from headscan.analysis.series import HOLD, checkpoint_steps, formation, formation_rule, with_steps  # noqa: E402
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
    formed = formation(rows, metrics=["prev_token", "induction"])
    return {"config": config, "log": pd.DataFrame(log), "rows": rows, "formed": formed, "tables": tables,
            "seconds": {"train": trained - started, "sweep": swept - trained, "total": swept - started}}


def first(formed: pd.DataFrame, metric: str, layer: int | None = None) -> pd.Series | None:
    part = formed[(formed["metric"] == metric) & formed["step"].notna()]
    if layer is not None:
        part = part[part["layer"] == layer]
    return part.sort_values(["step", "ci_low"], ascending=[True, False]).iloc[0] if len(part) else None


def drop_window(log: pd.DataFrame) -> tuple[int, int]:
    """The phase change, read off the loss as Olsson et al. read it off its derivative: the first and last
    checkpoints at which the loss on repeated tokens fell by more than a tenth of its whole fall (step 0 to the
    end) since the checkpoint before."""
    fall = log["repeat_loss"].iloc[0] - log["repeat_loss"].iloc[-1]
    steep = log.loc[-log["repeat_loss"].diff() > fall / 10, "step"]
    return (int(steep.min()), int(steep.max())) if len(steep) else (int(log["step"].iloc[-1]),) * 2


def figure(result: dict, window: tuple[int, int], path: Path) -> None:
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
    before = log.loc[log["step"] < window[0], "step"].max()  # the fall starts after the checkpoint before
    for axis in axes:
        axis.axvspan(before if pd.notna(before) else window[0], window[1], color="#e69f00", alpha=0.2, linewidth=0)
    fig.suptitle("A two-layer attention-only transformer over training (shaded: the phase change, where the loss on "
                 "repeated tokens falls fastest)", fontsize=10)
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
    gap = HOLD * 10  # the rule asks a head to hold HOLD further checkpoints: it may name a step that much late
    near = [head is not None and window[0] - gap <= head["step"] <= window[1] + gap for head in (prev, induction)]
    ok = all(near)
    figure(result, window, out / "induction_formation.png")
    formed.to_csv(out / "formation.csv", index=False)
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
    lines.append(f"phase change (the loss on repeated tokens falls by more than a tenth of its whole fall per "
                 f"checkpoint): steps {before} to {window[1]}; loss on repeated tokens "
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
widened by the {HOLD} checkpoints ({HOLD * 10} steps) the rule may lag. Rule: {formation_rule()} Thresholds are the roles' (`headscan.analysis.roles`): previous-token 0.5, induction 0.4
(Olsson et al.'s prefix-matching score, on the second copy's queries; copying is not tested). Numbers are
value [95% interval]; chance is what uniform attention over the keys each query sees would score on the same
queries. The phase change is shaded in the figure.

![previous-token and induction scores per head against the step, and the losses](induction_formation.png)

Every head that forms, by the rule above:

{markdown_table(table) if len(table) else "(none)"}

Reproduce: `python experiments/induction_formation.py` (offline; the checkpoints and the sweep go
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
