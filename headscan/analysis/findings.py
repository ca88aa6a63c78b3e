"""What a report states: sentences generated from the numbers, families side by side, runs against each other.

Every function here takes tables and returns DataFrames or sentences, so tests check them number by number.
What a metric is measured in, which end of it is striking and when it is 0 or undefined by construction all
come from the metric registry (through `headscan.analysis.ranking`); nothing here restates them.

This module draws nothing (see `headscan.plots`), lays out nothing (see `headscan.report`) and loads no model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from ..config import split_control
from ..metrics import describe
from ..tables import ModelProvenance
from .across import agreement_sentences
from .claims import (
    AT_CHANCE,
    NO_CHANCE,
    NO_EMPIRICAL,
    NO_INTERVAL,
    NO_NULL,
    NOT_DISCOVERED,
    OLDER_RULE,
    THIN,
    TOO_FEW,
    WITHIN_NULL,
    has_verdicts,
    null_text,
    why_not,
)
from .formats import pct
from .ranking import (
    WIDE_CI,
    ZERO,
    all_zero_or_undefined,
    bounded,
    ci_is_wide,
    striking_of,
    structural_reason,
    thin,
    top_heads,
)
from .roles import ROLES, head_roles, role_for

__all__ = ["findings", "findings_by_model"]

# What a share of attention is on, for the findings' sentences.
_ON = {
    "prev_token": "the previous token",
    "next_token": "the next token",
    "self": "itself",
    "first_token": "the first token",
    "sep": "separator tokens",
    "duplicate_token": "other occurrences of its own token",
    "induction": "the tokens that follow other occurrences of its own token",
}
# The roles whose heads findings count, with how a sentence names them.
_COUNTED = {"previous-token": "previous-token heads", "induction": "induction heads",
            "prefix-matching": "prefix-matching heads, attending like induction heads with no evidence that they copy"}
_FAILS = {AT_CHANCE: "is at chance", "below chance": "lies below chance", "above chance": "lies above chance",
          THIN: "rests on thin support", NO_INTERVAL: "has no interval", NO_CHANCE: "has no chance level recorded",
          WITHIN_NULL: "lies within its null", NOT_DISCOVERED: "is not a discovery at the false-discovery rate",
          NO_NULL: "has no null in a run without random-init controls", TOO_FEW: "rests on too few units to assess",
          NO_EMPIRICAL: "lies beyond uniform attention only, which untrained heads leave too; this run has no "
                        "random-init controls to test it against (sweep with --control random-init)",
          OLDER_RULE: "is no finding by the rule of the headscan that wrote the table (sweep again)"}


def _numbers(row, metric: str = "") -> str:
    """A row's interval and chance, as a claim states them: " (95% interval a to b; chance c)"."""
    parts = []
    if not (pd.isna(row["ci_low"]) or pd.isna(row["ci_high"])):
        parts.append(f"95% interval {_fmt(metric, row['ci_low'])} to {_fmt(metric, row['ci_high'])}")
        factor = row.get("cal_factor", float("nan"))
        if not pd.isna(factor) and factor > 1.005:  # the interval the test read, where it is wider
            parts.append(f"calibrated for its size x{factor:.2f}: {_fmt(metric, row['cal_low'])} to "
                         f"{_fmt(metric, row['cal_high'])}")
    if "chance" in row and not pd.isna(row["chance"]):
        parts.append(f"chance {_fmt(metric, row['chance'])}")
    if null_text(row):
        parts.append(null_text(row))
    return f" ({'; '.join(parts)})" if parts else ""


def _joint(best) -> str:
    """The interval over all heads at once that a head picked as the strongest may claim, where recorded."""
    low, high = best.get("joint_low", float("nan")), best.get("joint_high", float("nan"))
    if pd.isna(low) or pd.isna(high):
        return ""
    return f"; picked from all heads, {pct(low)} to {pct(high)} holds for every head at once"


def _fmt(metric: str, value: float) -> str:
    return pct(value) if not metric or bounded(metric) else f"{value:.2f} {describe(metric).unit}"


def _failing(reason: str) -> str:
    """A gate's reasons as a verb phrase: "is at chance and rests on thin support"."""
    return " and ".join(_FAILS.get(part, part) for part in reason.split("; ") if part)


# Where to say so of a thin row: its interval is not trusted, so neither is where it lies against chance.
UNASSESSED = "cannot be assessed on this corpus"
_AGAINST_CHANCE = (AT_CHANCE, "below chance", "above chance", WITHIN_NULL, NOT_DISCOVERED)


def _beyond(rows: pd.DataFrame) -> str:
    """How a sentence names the bar: the sweep's null where the table records verdicts, else chance."""
    return "beyond its null" if has_verdicts(rows) else "beyond chance"


def _passed_alone(row) -> bool:
    """The row fails only the false-discovery correction: its own one-sided p-value is at most 0.05."""
    return row["unsupported"] == NOT_DISCOVERED and not pd.isna(row.get("p_value", float("nan"))) and \
        row["p_value"] <= 0.05


def _assessable(reason: str) -> bool:
    """False where the row's interval cannot be assessed: the thin rule flags it, or it rests on fewer units than
    any calibration measured (`why_not`'s reasons hold THIN or TOO_FEW)."""
    return not {THIN, TOO_FEW} & set(reason.split("; "))


def _unassessed(reason: str) -> str:
    """A thin row's reasons as a verb phrase, without where its untrusted interval lies against chance."""
    return _failing("; ".join(part for part in reason.split("; ") if part not in _AGAINST_CHANCE))


def findings(heads: pd.DataFrame, *, provenance: Mapping[str, ModelProvenance] | None = None,
             controls: Mapping[str, Sequence[str]] | None = None, weights: pd.DataFrame | None = None) -> list[str]:
    """Sentences that state what the numbers show, generated from `heads` (never written by hand).

    All of `findings_by_model`'s sentences in one list, model by model, then those across runs.

    For each model: its strongest previous-token head (and, in a bidirectional model, next-token head);
    any other head that puts at least its role's threshold (`headscan.analysis.roles`) of its attention on one
    kind of token; how many heads hold the previous-token, induction and prefix-matching roles; metrics that
    are 0 or undefined for every head, and why when the registry says so; where attention is most focused
    and broadest; how many scores have wide intervals, or rest on thin support, or lie within chance. A
    sentence about a head is made only from a row that may carry a claim (`headscan.analysis.claims`: not
    thin, beyond chance) and states its interval and chance; where no head of a kind does, one sentence says
    so and why ("at chance"). `controls` (model -> its control models, `headscan.analysis.runs.Comparison`)
    adds to each sentence whether the control shows it too; `weights` (weights.parquet) gives the copying
    evidence that tells induction heads from prefix-matching ones. Across runs: how far two runs of the same
    model agree. `provenance` (model name -> its `ModelProvenance`) tells which models have no [SEP] token.

    >>> heads = pd.DataFrame({"model": "m", "family": "causal", "layer": 0, "head": [0, 1, 0, 1],
    ...                       "label": ["L0H0", "L0H1"] * 2, "metric": ["prev_token"] * 2 + ["next_token"] * 2,
    ...                       "value": [0.999, 0.1, 0.0, 0.0], "count": 10.0, "ci_low": [0.998, 0.05, 0, 0],
    ...                       "ci_high": [0.9995, 0.15, 0, 0], "chance": [0.2, 0.2, 0, 0]})
    >>> for sentence in findings(heads):
    ...     print(sentence)
    In m, L0H0 puts 99.9% of its attention on the previous token (95% interval 99.8% to 99.95%; chance 20.0%).
    1 of 2 heads in m are previous-token heads (`prev_token` ≥ 0.5 beyond chance).
    m's `next_token`: a causal model's queries cannot see later tokens, so it is 0 for every head.
    1 of 2 scores of m do not lie beyond chance on their striking side (their 95% interval holds the value of uniform attention, or lies on its other side); no finding here rests on them.
    """
    by_model = findings_by_model(heads, provenance=provenance, controls=controls, weights=weights)
    return [sentence for sentences in by_model.values() for sentence in sentences]


def findings_by_model(heads: pd.DataFrame, *, provenance: Mapping[str, ModelProvenance] | None = None,
                      controls: Mapping[str, Sequence[str]] | None = None,
                      weights: pd.DataFrame | None = None) -> dict[str, list[str]]:
    """`findings`, keyed by model (in the table's order), with the sentences across runs under ``""``."""
    by_model: dict[str, list[str]] = {}
    roles = head_roles(heads, weights) if len(heads) else None
    for model in dict.fromkeys(heads["model"]):
        rows = heads[heads["model"] == model]
        mine = [(c, heads[heads["model"] == c]) for c in (controls or {}).get(model, ())]
        by_model[model] = _model_findings(model, rows, (provenance or {}).get(model), mine, roles)
    agreement = agreement_sentences(heads)
    if agreement:
        by_model[""] = agreement
    return by_model


def _what_it_is(best: pd.Series, metric: str, roles: pd.DataFrame | None) -> str:
    """What role a head's sentence names, as `headscan.analysis.roles` says: for an induction-like head, an
    induction head (with its copying evidence) or prefix matching only; a duplicate-token head."""
    if metric not in ("induction", "duplicate_token") or roles is None:
        return ""
    mine = roles[(roles["model"] == best["model"]) & (roles["layer"] == best["layer"]) & (roles["head"] == best["head"])]
    if mine.empty:
        return ""
    if metric == "duplicate_token":
        return ": a duplicate-token head" if "duplicate" in mine["roles"].iloc[0] else ""
    if "induction" in mine["roles"].iloc[0]:
        return f": an induction head ({mine['evidence'].iloc[0]})"
    return ": prefix matching, with no evidence that it copies what it attends to"


def _control_clause(best: pd.Series, metric: str, controls: list[tuple[str, pd.DataFrame]]) -> str:
    """Whether each control shows what `best` (a top_heads row of a trained model) shows, in a sentence each;
    several random-init controls in one sentence."""
    out, untrained = [], []
    several = sum(split_control(c)[1] == "random-init" for c, _ in controls) > 1  # said in one clause together
    for name, rows in controls:
        row = rows[(rows["metric"] == metric) & (rows["layer"] == best["layer"]) & (rows["head"] == best["head"])]
        if row.empty or row["value"].isna().all():
            out.append(f" {name} has no `{metric}` for {best['label']}.")
            continue
        row = row.iloc[0]
        reason = why_not(row.to_frame().T, striking=describe(metric).striking).iloc[0]
        if several and split_control(name)[1] == "random-init":
            untrained.append((row, reason))
            continue
        verdict = "also shows it" if not reason and row["value"] >= best["value"] * 0.5 else (
            "shows it weaker" if not reason else f"does not: it {_failing(reason)}" if _assessable(reason)
            else f"{UNASSESSED}: it {_unassessed(reason)}")
        out.append(f" {name} {verdict}: {best['label']} {_fmt(metric, row['value'])}{_numbers(row, metric)}.")
    if untrained:
        values = [row["value"] for row, _ in untrained]
        found = sum(not reason for _, reason in untrained)
        out.append(f" In its {len(untrained)} random-init controls {best['label']} scores {_fmt(metric, min(values))} "
                   f"to {_fmt(metric, max(values))}, a finding in {found} (each tested against the others).")
    return "".join(out)


def _model_findings(model: str, rows: pd.DataFrame, provenance: ModelProvenance | None,
                    controls: list[tuple[str, pd.DataFrame]], roles: pd.DataFrame | None) -> list[str]:
    out = []
    family = str(rows["family"].iloc[0])
    metrics = list(dict.fromkeys(rows["metric"]))
    recorded = "chance" in rows.columns and rows["chance"].notna().any()
    if not recorded:
        out.append(f"{model}'s tables record no chance level (written by a headscan before 0.4): no head of it is "
                   "claimed; sweep again to judge them.")
    else:
        out += _strongest(model, rows, family, provenance, controls, roles)
        if roles is not None:
            out += _role_counts(model, rows, controls, roles)
    out += _by_construction(model, rows, family, provenance)
    if "entropy" in metrics:
        out += _entropy_by_layer(model, rows, recorded)
    out += _support(model, rows, family, provenance, recorded)
    return out


def _strongest(model: str, rows: pd.DataFrame, family: str, provenance: ModelProvenance | None,
               controls: list[tuple[str, pd.DataFrame]], roles: pd.DataFrame | None) -> list[str]:
    """The strongest heads of each "on what" metric of `model` (its tables record chance levels)."""
    out = []
    n_heads = len(rows[["layer", "head"]].drop_duplicates())
    metrics = list(dict.fromkeys(rows["metric"]))
    # The strongest heads: previous token always, next token in a bidirectional model, any other "on what"
    # metric where one head reaches its role's threshold; a row that cannot carry a claim is never one.
    for metric in [m for m in _ON if m in metrics]:
        if structural_reason(metric, family, provenance) is not None:
            continue  # said below, once
        top = top_heads(rows, metric=metric, n=n_heads)
        if top.empty:
            continue
        good = top[top["unsupported"] == ""]
        threshold = role_for(metric).threshold
        wanted = metric == "prev_token" or (metric == "next_token" and family == "bidirectional")
        if len(good):
            best = good.iloc[0]
            if wanted or best["value"] >= threshold:
                out.append(f"In {model}, {best['label']} puts {pct(best['value'])} of its attention on {_ON[metric]}"
                           f"{_numbers(best)}{_joint(best)}{_what_it_is(best, metric, roles)}."
                           f"{_control_clause(best, metric, controls)}")
        elif NO_EMPIRICAL in top.iloc[0]["unsupported"].split("; "):
            best = top.iloc[0]
            out.append(f"In {model}, {best['label']} puts {pct(best['value'])} of its attention on {_ON[metric]}"
                       f"{_numbers(best)}: beyond uniform attention, but no finding, since untrained heads leave "
                       "uniform attention too and this run has no random-init controls to test it against (sweep "
                       "with --control random-init).")
        elif not _assessable(top.iloc[0]["unsupported"]):
            best = top.iloc[0]
            out.append(f"Whether a head of {model} puts its attention on {_ON[metric]} {_beyond(rows)} {UNASSESSED}: "
                       f"the strongest, {best['label']} with {pct(best['value'])}{_numbers(best)}, "
                       f"{_unassessed(best['unsupported'])}.")
        elif _passed_alone(best := top.iloc[0]):
            # beyond its null by its own one-sided test, lost only to the correction for testing every row: saying
            # "no head ... beyond its null" would deny what its interval shows
            out.append(f"No head of {model} is a finding for attention on {_ON[metric]}: the strongest, "
                       f"{best['label']} with {pct(best['value'])}{_numbers(best)}, lies beyond its null by its own "
                       f"test (p {best['p_value']:.2g}), but not after the false-discovery correction over the "
                       "model's tested rows.")
        else:
            out.append(f"No head of {model} puts its attention on {_ON[metric]} {_beyond(rows)}: "
                       f"the strongest, {best['label']} with {pct(best['value'])}{_numbers(best)}, "
                       f"{_failing(best['unsupported'])}.")
    return out


def _role_counts(model: str, rows: pd.DataFrame, controls: list[tuple[str, pd.DataFrame]],
                 roles: pd.DataFrame) -> list[str]:
    """How many heads of `model` hold each counted role, beside its controls' counts."""
    out = []
    n_heads = len(rows[["layer", "head"]].drop_duplicates())
    metrics = list(dict.fromkeys(rows["metric"]))
    mine = roles[roles["model"] == model]
    for role_name, said in _COUNTED.items():
        role = next(r for r in ROLES if r.name == role_name)
        if not set(role.metrics) & set(metrics):
            continue
        many = sum(role_name in names for names in mine["roles"])
        if not many and role_name != "previous-token":
            continue
        versus = "".join(f"; {c}: {sum(role_name in names for names in roles[roles['model'] == c]['roles'])}"
                         for c, _ in controls)
        out.append(f"{many} of {n_heads} heads in {model} are {said} ({role.rule(has_verdicts(rows))}{versus}).")
    return out


def _by_construction(model: str, rows: pd.DataFrame, family: str, provenance: ModelProvenance | None) -> list[str]:
    """Metrics of `model` that are 0 or undefined for every head, by construction or in this run; and a score
    that should be so by construction but is not (check the sweep)."""
    out = []
    metrics = list(dict.fromkeys(rows["metric"]))
    for metric in metrics:
        part = rows[rows["metric"] == metric]
        values = part["value"]
        reason = structural_reason(metric, family, provenance)
        if reason is not None and all_zero_or_undefined(values):
            out.append(f"{model}'s `{metric}`: {reason}.")
        elif reason is not None:
            worst = part.loc[values.abs().fillna(-1).idxmax()]
            out.append(f"Check the sweep: {worst['label']} of {model} scores {worst['value']:.3g} on `{metric}`, "
                       f"yet {reason}.")
        elif values.isna().all():
            out.append(f"{model}'s `{metric}` is undefined for every head: no query of the corpus counts for it.")
        elif bounded(metric) and values.notna().all() and (values.abs() < ZERO).all():
            out.append(f"{model}'s `{metric}` is 0 for every head.")
    return out


def _entropy_by_layer(model: str, rows: pd.DataFrame, recorded: bool) -> list[str]:
    """Where `model`'s attention is most focused and broadest, by mean entropy per layer."""
    out = []
    entropy = rows[rows["metric"] == "entropy"]
    by_layer = entropy.groupby("layer")["value"].mean().dropna()
    uniform = entropy.groupby("layer")["chance"].mean() if recorded else None
    unit = describe("entropy").unit
    if len(by_layer) > 1:
        low, high = int(by_layer.idxmin()), int(by_layer.idxmax())
        def null(layer):
            return f"; uniform attention over the same keys {uniform[layer]:.2f}" if uniform is not None else ""
        out.append(f"In {model}, attention is most focused in layer {low} (mean entropy {by_layer.min():.2f} "
                   f"{unit}{null(low)}) and broadest in layer {high} ({by_layer.max():.2f} {unit}{null(high)}).")
    return out


def _support(model: str, rows: pd.DataFrame, family: str, provenance: ModelProvenance | None,
             recorded: bool) -> list[str]:
    """How many of `model`'s scores have wide intervals, thin support, or no distance from chance."""
    out = []
    shares = rows[rows["metric"].map(bounded).astype(bool) & rows["value"].notna()]
    wide = int(ci_is_wide(shares).sum())
    if wide:
        out.append(f"{wide} of {len(shares)} 0-1 scores of {model} have a 95% interval wider than {WIDE_CI:g}; "
                   "a larger corpus would narrow them.")
    defined = rows[rows["value"].notna()]
    n_thin = int(thin(defined).sum())  # not `thin`: that name is the function, for the whole of this one
    if n_thin:
        out.append(f"{n_thin} of {len(defined)} scores of {model} rest on thin support (too few segments or "
                   f"documents, or one holding much of the sum): whether they lie beyond chance {UNASSESSED}, and "
                   "no finding here rests on them.")
    measured = defined[defined["metric"].map(lambda m: structural_reason(m, family, provenance) is None).astype(bool)]
    if recorded and len(measured):
        reasons = why_not(measured, striking=striking_of(measured))
        near = int((reasons.str.contains("chance") & reasons.map(_assessable)).sum())  # thin: said above
        verdicts = {reason: int((reasons.map(lambda r, reason=reason: reason in r.split("; ")) & reasons.map(_assessable))
                                .sum()) for reason in (WITHIN_NULL, NOT_DISCOVERED, NO_NULL, NO_EMPIRICAL)}
        too_few = int(reasons.map(lambda r: TOO_FEW in r.split("; ")).sum())
        if any(verdicts.values()):
            parts = [f"{verdicts[WITHIN_NULL]} lie within their null"] * bool(verdicts[WITHIN_NULL]) + \
                [f"{verdicts[NOT_DISCOVERED]} lie beyond it but are not discoveries at the run's false-discovery "
                 "rate"] * bool(verdicts[NOT_DISCOVERED]) + \
                [f"{verdicts[NO_NULL]} have no null (metrics only random-init controls give one for; sweep with "
                 "--control random-init)"] * bool(verdicts[NO_NULL]) + \
                [f"{verdicts[NO_EMPIRICAL]} lie beyond uniform attention only, which untrained heads leave too (no "
                 "random-init controls in this run)"] * bool(verdicts[NO_EMPIRICAL])
            out.append(f"{sum(verdicts.values())} of {len(measured)} scores of {model} are not findings: "
                       f"{', '.join(parts)}; no finding here rests on them.")
        if too_few:
            out.append(f"{too_few} of {len(measured)} scores of {model} rest on too few units to assess (fewer than "
                       "any size whose coverage was measured): neither findings nor shown not to be.")
        if near:
            out.append(f"{near} of {len(measured)} scores of {model} do not lie beyond chance on their striking side "
                       "(their 95% interval holds the value of uniform attention, or lies on its other side); no "
                       "finding here rests on them.")
    return out
