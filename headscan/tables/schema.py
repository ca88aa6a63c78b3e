"""The registry of tables: the columns every table shares, each table's own keys, and how heads are labelled.

Every table has the same head columns first (`HEAD_COLUMNS`; a table about whole models, `MODEL_COLUMNS`), then
its own key columns, then the same value columns (`VALUE_COLUMNS`). A new table is one `register_table` call; writing, loading, combining and
`headscan show` go through `TABLES`, so nothing else changes.

Layers and heads are 0-indexed integers (the TransformerLens convention), and ``label`` spells them
``L{layer}H{head}``: Clark et al.'s (2019) 1-indexed BERT "head 3-1" is ``L2H0`` here.
``value`` is ``sum / count`` and is NaN where ``count`` is 0 (the metric is not defined there), never -1.
``chance`` is what the null head, uniform attention over the keys each query sees, scores on the same
queries (`headscan.metrics.chance`); every table has it, and a claim about a row needs its interval beyond it.

This module imports no torch.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import pandas as pd

from ..errors import TablesError

__all__ = ["HEAD_COLUMNS", "MODEL_COLUMNS", "VALUE_COLUMNS", "ADDED_LATER", "FINDING_EXTRA", "Table", "TABLES", "register_table", "tables_markdown",
           "head_label", "head_columns", "column_notes"]

# The columns every table starts with: which head a row is about. Column name -> pandas dtype.
HEAD_COLUMNS: dict[str, str] = {
    "model": "string",  # the model's name as given to the sweep (alias, Hugging Face id or folder name)
    "family": "string",  # "causal" or "bidirectional"
    "layer": "int64",  # 0-indexed
    "head": "int64",  # 0-indexed query head
    "label": "string",  # "L{layer}H{head}"
    "kv_group": "int64",  # key/value head this query head reads (grouped-query attention); == head without GQA
}

# The columns a table about whole models starts with instead (the masking test of headscan retrieval).
MODEL_COLUMNS: dict[str, str] = {c: HEAD_COLUMNS[c] for c in ("model", "family")}

# The columns every table ends with: the score and how sure it is.
VALUE_COLUMNS: dict[str, str] = {
    "value": "float64",  # sum / count; NaN where count == 0
    "sum": "float64",  # sum of per-query scores over the corpus
    "count": "Int64",  # number of queries that count for this metric; <NA> in weights.parquet, which sums nothing
    "ci_low": "float64",  # lower end of the 95% bootstrap interval; NaN where undefined
    "ci_high": "float64",  # upper end
    "units": "Int64",  # bootstrap units (segments or documents) with count > 0: how many the value rests on
    "top_unit_share": "float64",  # the largest single unit's share of the sum: near 1, one unit decides the value
    "n_eff": "float64",  # effective units of the sum, (sum |s_u|)^2 / sum s_u^2 (headscan.intervals.effective_units)
    "variance_df": "float64",  # the bootstrap's degrees of freedom of the interval's SE (intervals.variance_df)
    "thin": "boolean",  # do not trust the interval (headscan.intervals.thin); <NA> where not recorded
    "chance": "float64",  # the value under uniform attention over what each query sees, on the same queries
}

# Columns a table written by an older headscan may lack; they read back as NaN or <NA> ("not recorded").
ADDED_LATER = ("units", "top_unit_share", "chance", "n_eff", "variance_df", "thin")
# Extra columns of one table that its older files may lack; read back as NaN ("not recorded") like ADDED_LATER.
EXTRA_ADDED_LATER = ("vs_baseline", "vs_baseline_low", "vs_baseline_high", "null_kind", "null_low", "null_high",
                     "p_value", "q_value", "finding", "joint_low", "joint_high", "cal_low", "cal_high", "cal_factor",
                     "cal_basis", "verdict", "null_se")
# The verdict columns of the tables findings are made from (`headscan.metrics.nulls`): the row's null, its range,
# its one-sided p-value against it, its q-value over the model's family, and whether it is a finding.
FINDING_EXTRA = {"null_kind": "string", "null_low": "float64", "null_high": "float64", "p_value": "float64",
                 "q_value": "float64", "finding": "boolean",
                 # the interval the test read: ci_low/ci_high widened by cal_factor, what the row's family needed to
                 # hold 95% at its units (cal_basis: measured, widest measured, too few units); headscan.intervals.calibration
                 "cal_low": "float64", "cal_high": "float64", "cal_factor": "float64", "cal_basis": "string",
                 # "finding", or why the row is not one (headscan.metrics.nulls.VERDICTS)
                 "verdict": "string",
                 # the 95% interval that holds for every head of the model at once on this metric and key (max-t):
                 # what a head picked as the top may claim (headscan.intervals.joint_interval)
                 "joint_low": "float64", "joint_high": "float64"}

# The syntax table's in-sample comparison with the baseline and its cross-fit's choices
# (`headscan.scan.passes.baseline`): read back as NaN from tables written before headscan kept them.
SYNTAX_CROSS_FIT = {"baseline_offset_even": "Int64", "baseline_offset_odd": "Int64",
                    "baseline_in_sample": "float64", "vs_baseline_in_sample": "float64",
                    "vs_baseline_in_sample_low": "float64", "vs_baseline_in_sample_high": "float64",
                    "best_even": "boolean", "best_odd": "boolean", "best_held_out": "float64",
                    "best_vs_baseline": "float64", "best_vs_baseline_low": "float64",
                    "best_vs_baseline_high": "float64"}
EXTRA_ADDED_LATER += tuple(SYNTAX_CROSS_FIT)


@dataclass(frozen=True)
class Table:
    """A table of the registry: its name (and file), its own key columns, and what a row is."""

    name: str
    keys: dict[str, str]  # key columns after HEAD_COLUMNS, with dtypes; "metric" is filled with the metric's name
    description: str  # "one row per ...", shown by `headscan show` and docs/tables.md
    extra: dict[str, str] = field(default_factory=dict)  # columns after VALUE_COLUMNS that only this table has
    per_head: bool = True  # False: a row is about a model as a whole (MODEL_COLUMNS instead of HEAD_COLUMNS)

    @property
    def file(self) -> str:
        return f"{self.name}.parquet"

    @property
    def columns(self) -> dict[str, str]:
        """The whole schema: column name -> pandas dtype, in order."""
        return self.leading | self.keys | VALUE_COLUMNS | self.extra

    @property
    def leading(self) -> dict[str, str]:
        """The columns a row starts with: which head it is about, or only which model."""
        return HEAD_COLUMNS if self.per_head else MODEL_COLUMNS

    @property
    def row_key(self) -> list[str]:
        """Columns that identify a row (the head's other columns follow from model, layer and head)."""
        return [*self.leading, *self.keys]

    def conform(self, frame: pd.DataFrame) -> pd.DataFrame:
        """`frame` with exactly this table's columns, in order and with their dtypes."""
        later = (*ADDED_LATER, *(c for c in EXTRA_ADDED_LATER if c in self.extra))
        frame = frame.assign(**{c: float("nan") for c in later if c not in frame.columns})
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise TablesError(f"{self.name} table is missing columns {missing}; expected {list(self.columns)}")
        frame = frame[list(self.columns)]
        # Counts come as floats from sums (and as floats from tables written before they were whole numbers):
        # round them, so a count summed as 2.9999999999 is 3 rather than a failed cast.
        counts = {c: frame[c].astype("float64").round() for c, dtype in self.columns.items()
                  if dtype == "Int64" and frame[c].dtype.kind == "f"}
        frame = frame.assign(**counts)
        # a column already of its dtype is left as it is (astype would copy it for nothing: a fifth of a small
        # sweep's tables step)
        recast = {c: dtype for c, dtype in self.columns.items() if frame[c].dtype != _pandas_dtype(dtype)}
        return (frame.astype(recast) if recast else frame).reset_index(drop=True)


TABLES: dict[str, Table] = {}
_pandas_dtype = functools.cache(pd.api.types.pandas_dtype)


def register_table(name: str, keys: dict[str, str], description: str, extra: dict[str, str] | None = None, *,
                   per_head: bool = True) -> Table:
    """Declare a table; metrics then name it in `headscan.metrics.register(table=...)`. A table whose rows are
    about a whole model (`per_head` False) starts with `MODEL_COLUMNS` rather than `HEAD_COLUMNS`.

    `extra` columns follow the value columns; the sweep fills them (a table's baseline, say), and `combine`
    leaves them NaN, since they are not sums that add up.
    """
    if name in TABLES:
        raise TablesError(f"table {name!r} is registered twice; pick another name")
    clash = (set(keys) | set(extra or {})) & (set(HEAD_COLUMNS) | set(VALUE_COLUMNS))
    if clash or set(keys) & set(extra or {}):
        raise TablesError(f"table {name!r}: columns {sorted(clash or set(keys) & set(extra or {}))} clash with "
                          f"the shared columns or each other")
    TABLES[name] = Table(name, dict(keys), description, dict(extra or {}), per_head)
    return TABLES[name]


_VERDICT = ("; null_kind, null_low, null_high, p_value, q_value and finding: the row's test against what heads "
            "that learned nothing score, corrected over the model's family (headscan.metrics.nulls: heads with syntax, value apart); "
            "cal_low, cal_high: the calibrated interval the test read (ci_low, ci_high widened by cal_factor, "
            "cal_basis saying what the factor rests on; headscan.intervals.calibration); verdict: 'finding' or why "
            "not; joint_low and joint_high: the 95% interval that holds for all the model's heads at once (max-t), "
            "what a top head may claim")
register_table("heads", {"metric": "string"}, "one row per (model, layer, head, metric)" + _VERDICT, extra=FINDING_EXTRA)
register_table("offsets", {"offset": "int64"}, "one row per (model, layer, head, offset): A[q, q + offset]")
register_table("positions", {"metric": "string", "bucket": "int64"},
               "one row per (model, layer, head, metric, bucket): a metric over the queries whose position lies in "
               "[bucket, 2 * bucket) (bucket 0: position 0 alone), for long contexts")
register_table("syntax", {"relation": "string", "direction": "string"},
               "one row per (model, layer, head, relation, direction): share of dependents whose gold head the "
               "head's attention picks (CoNLL-U corpora; Clark et al. 2019); directions ending in _visible, a causal "
               "model's only, count the dependents whose gold pair the attending word can see (a causal query sees "
               "no later word; a bidirectional model sees every head and has no _visible rows, which would repeat "
               "its plain ones); "
               "baseline and vs_baseline are cross-fitted (headscan.scan.passes.baseline.cross_fit): the units are "
               "split by the parity of their index and each half scored with the best fixed offset of the other "
               "half (baseline_offset_even: the offset best on the even units, used on the odd ones; "
               "baseline_offset_odd the reverse); baseline is that held-out offset rule's accuracy, vs_baseline the "
               "head's accuracy minus it on the same dependents, with its 95% interval over the units "
               "(vs_baseline_low, vs_baseline_high), what findings rest on; baseline_offset is the offset best on "
               "the whole corpus, and baseline_in_sample, vs_baseline_in_sample (_low, _high) the same comparison "
               "with it, chosen and estimated on the same words (a little optimistic); best_even (best_odd): the "
               "head is the relation and direction's most accurate on the even (odd) units; best_held_out: the "
               "accuracy of the head most accurate on the other half, added up over both halves, and "
               "best_vs_baseline (_low, _high) its cross-fitted difference from the offset, the same on every row "
               "of the relation and direction; NaN or <NA> where a half has no dependent" + _VERDICT,
               extra={"baseline": "float64", "baseline_offset": "Int64", "vs_baseline": "float64",
                      "vs_baseline_low": "float64", "vs_baseline_high": "float64", **SYNTAX_CROSS_FIT,
                      **FINDING_EXTRA})
register_table("value", {"metric": "string"},
               "one row per (model, layer, head, metric): the heads.parquet metrics on value-weighted attention, "
               "A[q, k] ||f(x_k)|| renormalised per query (Kobayashi et al. 2020)" + _VERDICT, extra=FINDING_EXTRA)
register_table("weights", {"metric": "string"},
               "one row per (model, layer, head, metric): scores read off the weights alone, no corpus "
               "(no sum or count, NaN and <NA>: nothing is summed; chance of copying is 0: negating W_V negates "
               "every eigenvalue, so OV weights drawn with either sign equally likely score 0 on average)",
               extra={"embedding": "string"})
register_table("composition", {"mode": "string", "source_layer": "int64", "source_head": "int64"},
               "one row per (model, layer, head, mode, source_layer, source_head): how much the source head's output "
               "can move this later head's queries (mode Q), keys (K) or values (V), the Frobenius-norm ratio of "
               "Elhage et al. (2021) on the weights as TransformerLens' default processing leaves them (norm gain "
               "folded; LayerNorm models centred), from the weights alone (no sum or count); chance is the mean of "
               "the same score over the model's own pairs with the residual basis between them turned by a "
               "Haar-random rotation (each matrix's spectrum kept), null_high that null's 99th percentile, null_se "
               "its bootstrap standard error over the draws, beyond value > null_high",
               extra={"source_label": "string", "null_high": "float64", "null_se": "float64", "beyond": "boolean"})
register_table("importance", {"method": "string", "target": "string"},
               "one row per (model, layer, head, method, target): the change of the target (a loss) when the head's "
               "output is removed, ablated minus clean; 0 is a head that changes nothing")
register_table("patching", {"method": "string", "target": "string", "position": "Int64"},
               "one row per (model, layer, head, method, target, position): contrastive activation patching over "
               "prompt pairs (headscan patch); method denoise (the head's clean output into the corrupted run: what "
               "it suffices to restore), noise (the corrupted output into the clean run: what is lost without it, its "
               "necessity) or their attribution-patching estimates atp_denoise and atp_noise; target fraction (sum "
               "over pairs of the logit-difference change over sum of LD(clean) - LD(corrupted); heads' fractions do "
               "not add up to 1) or logit_diff (its mean over pairs, logits); position: the head patched at that "
               "position alone, <NA> at every position; count: pairs; units: pairs whose own LD(clean) - "
               "LD(corrupted) is not 0 (fraction), every pair (logit_diff); full_difference: the sum over pairs of "
               "LD(clean) - LD(corrupted), the fraction's denominator (its value is sum / full_difference); chance 0, "
               "no effect, which a head scores whether it carries nothing or its part is also carried by others "
               "(denoising scores a redundant head 0)", extra={"full_difference": "float64"})
register_table("paths", {"sender_layer": "int64", "sender_head": "int64", "sender_label": "string", "path": "string",
                         "target": "string"},
               "one row per (model, layer, head, sender_layer, sender_head, path, target): path patching from the "
               "sender head to this (receiver) head through its queries (path q), keys (k) or values (v) over prompt "
               "pairs (headscan patch --path-top / --paths; --path-top's candidates chosen on other pairs than these, "
               "run.json says which); a key or value path of a grouped-query receiver is its key/value head's (kv_group), "
               "which every query head of that group reads; targets, count, units and full_difference as in "
               "patching.parquet; p_value: one-sided that the path restores more than 0 (Student's t on the "
               "bootstrap's degrees of freedom); q_value: Benjamini-Hochberg over the paths tested, per model and "
               "target",
               extra={"full_difference": "float64",
                      "p_value": "float64",  # one-sided, that the path restores more than 0
                      "q_value": "float64"})  # Benjamini-Hochberg over the model's paths tested, per target
register_table("similarity", {"other_layer": "int64", "other_head": "int64", "other_label": "string"},
               "one row per (model, layer, head, other_layer, other_head), both orders and the diagonal: the mean "
               "Jensen-Shannon divergence (nats) between the two heads' attention over the same queries of the "
               "similarity sample, Clark et al.'s smoothing (sum: summed over queries; count: queries; units: "
               "sampled segments; no interval and no chance: NaN); written with --similarity-sample")
register_table("similarity_across", {"other_model": "string", "other_layer": "int64", "other_head": "int64",
                                     "other_label": "string"},
               "one row per (model, layer, head, other_model, other_layer, other_head), for each pair of models of a "
               "sweep in its order (model first): the mean Jensen-Shannon divergence (nats) between the two heads' "
               "word-level attention (Clark et al.'s, with a sink key for tokens of no word) over the word queries of "
               "the similarity sample (CoNLL-U corpora; count: word queries; units: segments; no interval, no chance)")
register_table("examples", {"metric": "string", "end": "string", "rank": "int64"},
               "one row per (model, layer, head, metric, end, rank): of every heads.parquet metric, the bootstrap "
               "units (segments or documents) where the head scores highest (end 'top', rank 1 the highest) and "
               "lowest ('bottom'); value, sum and count are the unit's own (units 1; no interval, no chance: NaN); "
               "unit is its index (a document's or a segment's, as the sweep resampled; <NA> where runs of different "
               "parts of a corpus were combined), text the unit's text; "
               "written with --examples K (default 5)",
               extra={"unit": "Int64", "text": "string"})

register_table("retrieval", {"metric": "string"},
               "one row per (model, layer, head, metric): the retrieval score of needle-in-a-haystack trials (Wu et "
               "al. 2024), a mean over trials (the bootstrap unit), gated and ungated; written by headscan retrieval")
register_table("retrieval_trials", {"trial": "int64"},
               "one row per (model, layer, head, trial): a trial's copying steps (sum) over the answer's tokens "
               "(count), with the trial's prompt, answer and gate; written by headscan retrieval",
               extra={"length": "int64", "depth": "float64", "needle": "int64", "tokens": "int64",
                      "needle_position": "Int64", "steps": "int64", "response": "string", "recall": "float64",
                      "passed": "boolean", "span_found": "boolean"})
_MASKED = ("condition 'none' (no head masked), 'top' (the top k retrieval heads) or 'random' (k random heads, one "
           "from the layer of each top head, never a top head; draw numbers the seeded draw, <NA> pools every draw); "
           "heads lists the L{layer}H{head} masked (a head masked has its output z zeroed at every position, prefill "
           "and decoding)")
register_table("retrieval_masking", {"condition": "string", "draw": "Int64", "length": "Int64", "depth": "float64"},
               "one row per (model, condition, draw, length, depth): needle accuracy, the mean over trials of the "
               "answer's ROUGE-1 recall, with heads masked, its 95% interval resampling needles (a needle's trials "
               "are one unit); " + _MASKED + "; length <NA> and depth NaN pool every trial; drop, drop_low, "
               "drop_high: the paired difference from condition none on the same trials with its 95% interval (NaN "
               "for none); p_value (condition top): the top set's drop ranked among the random draws' drops, "
               "(1 + #draws whose drop is at least as large) / (draws + 1); passed: the share of trials above the "
               "gate; chance NaN; written by headscan retrieval --mask-top / --mask-random, on trials of needles "
               "that did not choose the top heads",
               extra={"k": "Int64", "heads": "string", "passed": "float64", "drop": "float64", "drop_low": "float64",
                      "drop_high": "float64", "p_value": "float64"}, per_head=False)
register_table("retrieval_masking_trials", {"trial": "int64", "condition": "string", "draw": "Int64"},
               "one row per (model, trial, condition, draw): one trial decoded with heads masked (value and sum: the "
               "answer's ROUGE-1 recall; count 1; no interval, no chance: NaN); " + _MASKED + "; written by "
               "headscan retrieval --mask-top / --mask-random",
               extra={"length": "int64", "depth": "float64", "needle": "int64", "k": "Int64", "heads": "string",
                      "steps": "int64", "response": "string", "passed": "boolean"}, per_head=False)


def tables_markdown() -> str:
    """The registered tables and their columns as Markdown, from the registry (docs/tables.md uses it)."""
    lines = ["| file | one row per | columns |", "|---|---|---|"]
    for table in TABLES.values():
        own = ", ".join(f"`{name}`" for name in table.keys)
        extra = "".join(f", `{name}`" for name in table.extra)
        leading = "head columns" if table.per_head else "`model`, `family`"
        lines.append(f"| `{table.file}` | {table.description.removeprefix('one row per ')} | {leading}, {own}, "
                     f"value columns{extra} |")
    comments = _column_comments()
    lines.append("")
    lines.append("Head columns: " + "; ".join(f"`{c}` ({comments.get(c, '')})" for c in HEAD_COLUMNS) + ".")
    lines.append("")
    lines.append("Value columns: " + "; ".join(f"`{c}` ({comments.get(c, '')})" for c in VALUE_COLUMNS) + ".")
    return "\n".join(lines) + "\n"


def column_notes() -> dict[str, str]:
    """What each shared column (`HEAD_COLUMNS`, `VALUE_COLUMNS`, `FINDING_EXTRA`) holds, by name: its trailing
    comment in this module, the one description that docs/tables.md and ``headscan show``'s footers read.

    >>> column_notes()["units"]
    'bootstrap units (segments or documents) with count > 0: how many the value rests on'
    """
    return _column_comments()


def _column_comments() -> dict[str, str]:
    """Each shared column's trailing comment in this file: the schema documents itself once."""
    import inspect
    import re

    source = inspect.getsource(inspect.getmodule(_column_comments))
    return {m.group(1): m.group(2).strip() for m in re.finditer(r'^    "(\w+)": "\w+",  # (.*)$', source, re.M)}


def head_label(layer: int, head: int) -> str:
    """The 0-indexed label of a head.

    >>> head_label(4, 11)
    'L4H11'
    """
    return f"L{layer}H{head}"


def head_columns(model: str, family: str | None, layer, head, kv_group) -> dict:
    """The head columns of rows of one model, `layer`, `head` and `kv_group` given per row (arrays or lists).

    >>> head_columns("m", "causal", [0, 1], [2, 3], [0, 1])["label"]
    ['L0H2', 'L1H3']
    """
    return {"model": model, "family": family, "layer": layer, "head": head,
            "label": [head_label(at, h) for at, h in zip(layer, head)], "kv_group": kv_group}
