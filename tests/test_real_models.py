"""Real pretrained models that install from PyPI: minilm (BERT encoder) and smollm2 (Llama decoder).

Known heads, not just shapes: minilm has a near-perfect previous-token head and a strong next-token head;
a causal model never looks ahead; smollm2 has induction heads on repeated random tokens.
"""

import pytest

from headscan import SweepConfig
from headscan.corpus import read_corpus
from headscan.scan import sweep_model

pytestmark = pytest.mark.real
CONFIG = SweepConfig(device="cpu", bootstrap=100, max_len=64)


@pytest.fixture(scope="module")
def minilm_ewt(minilm, ewt_dev):
    return sweep_model(minilm, read_corpus(ewt_dev, limit=96), CONFIG)


@pytest.fixture(scope="module")
def smollm2_ewt(smollm2, ewt_dev):
    return sweep_model(smollm2, read_corpus(ewt_dev, limit=32), CONFIG)


def top(heads, metric):
    return heads[heads.metric == metric].sort_values("value", ascending=False).iloc[0]


def test_minilm_has_a_previous_token_head_above_0_9(minilm_ewt):
    heads, provenance = minilm_ewt.heads, minilm_ewt.provenance.models[0]
    best = top(heads, "prev_token")
    assert best["value"] > 0.9 and best["ci_low"] > 0.9, best["label"]
    assert provenance.n_layers == 6 and provenance.n_heads == 12
    assert len(heads[heads.metric == "prev_token"]) == 6 * 12


def test_bidirectional_minilm_has_a_next_token_head_above_0_5(minilm_ewt):
    assert top(minilm_ewt.heads, "next_token")["value"] > 0.5


def test_causal_smollm2_never_looks_ahead(smollm2_ewt):
    heads, offsets, provenance = smollm2_ewt.heads, smollm2_ewt.offsets, smollm2_ewt.provenance.models[0]
    assert provenance.family == "causal" and provenance.n_kv_heads == 3
    assert len(heads[heads.metric == "next_token"]) == 30 * 9
    assert (heads.loc[heads.metric == "next_token", "value"].abs() < 1e-6).all()
    assert (offsets.loc[offsets.offset > 0, "value"].abs() < 1e-6).all()
    assert sorted(heads["kv_group"].unique()) == [0, 1, 2]  # 9 query heads share 3 key/value heads


def test_smollm2_has_induction_heads_on_repeated_random_tokens(smollm2):
    heads = sweep_model(smollm2, read_corpus("repeat-random:n=24,count=12,seed=0"), CONFIG).heads
    induction = heads[heads.metric == "induction"]["value"]
    assert induction.max() > 0.3
    assert induction.max() > 5 * induction.mean()


def test_leaving_specials_out_removes_the_sink_and_raises_prev_next(minilm, ewt_dev):
    corpus = read_corpus(ewt_dev, limit=48)
    kept = sweep_model(minilm, corpus, CONFIG).heads
    left_out = sweep_model(minilm, corpus, SweepConfig(device="cpu", bootstrap=0, max_len=64, specials="exclude")).heads

    def by_head(frame, metric):
        return frame[frame.metric == metric].set_index("label")["value"]

    sink = by_head(kept, "first_token") + by_head(kept, "sep")
    for metric in ("prev_token", "next_token"):
        share = by_head(kept, metric)
        change = by_head(left_out, metric) - share
        # Renormalising over the keys left divides each query's row by (1 - its sink share), so the gain
        # should track share * sink / (1 - sink), up to the queries next to [CLS]/[SEP], which do not count once
        # they are left out.
        predicted = share * sink / (1 - sink)
        print(f"{metric}: mean change {change.mean():+.3f}, max {change.max():+.3f} ({change.idxmax()}), "
              f"min {change.min():+.3f}, correlation with the prediction {change.corr(predicted):.2f}")
        assert change.mean() > 0, metric
        assert change.corr(predicted) > 0.8, metric


def test_both_embedded_models_sweep_at_max_len_1024(tmp_path):
    """`headscan sweep --max-len 1024` over builtin, past minilm's 512-token context:
    minilm is clamped to 512 with one line saying so, smollm2 (8,192 tokens) sweeps at 1024, and each model's
    position buckets stop at its own max_len."""
    from click.testing import CliRunner

    from headscan.cli import cli
    from headscan.tables import load

    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["sweep", "-m", "minilm", "-m", "smollm2", "-c", "builtin", "--limit", "8",
                                      "--max-len", "1024", "--bootstrap", "0", "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    run = load(out)
    minilm, smollm2 = run.provenance.model("minilm"), run.provenance.model("smollm2")
    line = "minilm: --max-len 1024 is past its context of 512 tokens; swept with --max-len 512"
    assert line in result.output.splitlines() and minilm.max_len_note == line
    assert (minilm.max_len, smollm2.max_len, smollm2.max_len_note) == (512, 1024, None)
    buckets = run.frames["positions"].groupby("model")["bucket"].max().to_dict()
    assert buckets == {"minilm": 256, "smollm2": 512}


def test_each_embedded_model_carries_its_caveat_and_its_untrained_control_does_not(minilm):
    from headscan.models import load_model

    assert "distilled" in minilm.extra["caveat"] and "contrastively" in minilm.extra["caveat"]
    assert "caveat" not in load_model("minilm", control="random-init").extra
