"""A bidirectional model's syntax table has no ``_visible`` rows: every head is visible to it, so they would be its
plain rows again (``all``'s its ``all_nonroot``) and put each of its findings into the Benjamini-Hochberg family
twice. Its sweep plans, scores and writes the plain directions alone; a causal model's keeps both; shards merge
into the whole sweep; a state swept with the visible columns for a bidirectional model (an older headscan) is
refused by name, not read column for column; and the report judges each model on its own rows.

The plain rows' numbers are checked against loops over Hugging Face's attentions in tests/test_syntax.py
(`test_tiny_bert_syntax_table_equals_the_plain_loop_with_specials`) and tests/test_syntax_cross_fit.py.
"""

import re

import pytest
from conftest import assert_merged_equals_whole, treebank_corpus

from headscan.analysis import syntax as syntactic
from headscan.analysis.runs import compare_runs
from headscan.config import SweepConfig
from headscan.corpus import read_corpus
from headscan.errors import TablesError
from headscan.metrics.syntax import COLUMNS, PLAIN_COLUMNS
from headscan.models import load_model
from headscan.report import build as report
from headscan.report.figures import Pngs
from headscan.report.sections.syntax import syntax_section
from headscan.scan import merge, sweep
from headscan.scan.finish import finish
from headscan.scan.plan import column_names, columns_of, plan_sweep
from headscan.scan.reduce import accumulate
from headscan.scan.resume import check_resumable
from headscan.tables import load

# batch_size 1: a shard batches other segments together, and padding moves float32 sums in the last bits
SETTINGS = dict(device="cpu", bootstrap=20, window=4, batch_size=1, values=False, bootstrap_unit="document")
PLAIN = {"dependent_to_head", "head_to_dependent"}
VISIBLE = {"dependent_to_head_visible", "head_to_dependent_visible"}


@pytest.fixture(scope="module")
def swept(tmp_path_factory, tiny_gpt2, tiny_bert):
    root = tmp_path_factory.mktemp("visible")
    corpus = treebank_corpus(root, 12)  # 4 documents of 3 sentences
    models = [str(tiny_gpt2), str(tiny_bert)]
    return root, corpus, models, sweep(models, corpus, root / "whole", **SETTINGS)


def test_a_bidirectional_models_sweep_plans_and_writes_the_plain_directions_and_a_causal_ones_both(swept):
    root, corpus, (gpt2, bert), whole = swept
    syntax = whole["syntax"]
    directions = {family: set(rows) for family, rows in syntax.groupby("family", observed=True)["direction"]}
    assert directions == {"bidirectional": PLAIN, "causal": PLAIN | VISIBLE}
    rows = syntax.groupby("model").size()
    assert rows[gpt2] == 2 * 4 * len(COLUMNS) and rows[bert] == 2 * 4 * len(PLAIN_COLUMNS)  # layers, heads, columns
    assert syntax.loc[syntax["model"] == bert, "count"].gt(0).any()
    text = read_corpus(corpus)
    for spec, want in ((gpt2, COLUMNS), (bert, PLAIN_COLUMNS)):
        plan = plan_sweep(load_model(spec, device="cpu"), text, SweepConfig(**SETTINGS))
        assert [key for metric, key, _ in plan.columns if metric.name == "syntax"] == list(want)
        assert len(plan.fingerprint["columns"]) == len(plan.columns)


def test_shards_of_both_models_merge_into_the_whole_sweep(swept):
    root, corpus, models, whole = swept
    parts = [root / f"part-{k}" for k in range(2)]
    for k, part in enumerate(parts):
        sweep(models, corpus, part, shard=f"{k}/2", **SETTINGS)
    assert_merged_equals_whole(whole, merge(parts, root / "merged"))


def test_a_state_swept_with_a_bidirectional_models_visible_columns_is_refused_by_name(swept):
    """An older headscan planned the visible columns for every model: its state of a bidirectional model holds
    them, and neither finishing it (a merge of its shards) nor resuming it may read its columns as this headscan's."""
    root, corpus, (_, bert), _ = swept
    model, text = load_model(bert, device="cpu"), read_corpus(corpus)
    plan = plan_sweep(model, text, SweepConfig(**SETTINGS))
    state = accumulate(model, text, plan)
    older = column_names(columns_of(plan.config, True, causal=True))  # the syntax table's every direction
    state.fingerprint = dict(state.fingerprint, columns=older)
    extra = len(COLUMNS) - len(PLAIN_COLUMNS)
    with pytest.raises(TablesError, match=rf"^{re.escape(bert)}: its partial state's score columns are not those this headscan "
                                          rf"finishes for it \({len(older)} != {len(older) - extra} score columns "
                                          rf"\({extra} only on the left, such as syntax all dependent_to_head_visible; "
                                          rf"metrics or their axes differ\)\).*; sweep it again$"):
        finish(state, plan.config)
    with pytest.raises(TablesError, match=rf"^x\.npz: a stopped sweep of {re.escape(bert)} with other inputs \(columns: "
                                          rf"{len(older)} != {len(older) - extra} score columns \({extra} only on the "
                                          rf"left, such as syntax all dependent_to_head_visible; "):
        check_resumable(state, plan.fingerprint, None, "x.npz", bert)


def test_the_report_judges_each_model_on_its_own_rows_and_renders_the_section_for_both(swept, tmp_path):
    root, _, (gpt2, bert), whole = swept
    best = syntactic.best_heads(whole["syntax"])
    assert set(best["model"]) == {gpt2, bert} and set(best["direction"]) <= PLAIN
    assert not best.loc[best["model"] == bert, "visible"].any()  # its plain rows: it has no others
    assert best.loc[best["model"] == gpt2, "visible"].all()  # the dependents whose head it can see
    blocks = syntax_section(compare_runs([load(root / "whole")]), {}, Pngs())
    (table,) = [block for block in blocks if type(block).__name__ == "Table"]
    seen = table.frame["dependents"].str.endswith(" seen")
    assert set(table.frame.loc[seen, "model"]) == {gpt2} and set(table.frame.loc[~seen, "model"]) == {bert}
    page = report.write_report([load(root / "whole")], tmp_path / "report")
    section = (page / "report.md").read_text()
    section = section[section.index("## Syntactic heads"):]
    section = section[:section.index("\n## ", 1)]
    assert gpt2 in section and bert in section
