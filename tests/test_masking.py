"""The masking test of retrieval heads: masking the planted copying head breaks the needle answers and masking
another head does not; heads are chosen on the even needles and only the odd needles' trials are masked (or an
earlier run on other needles ranks them, and one on the same needles is refused); intervals resample needles; the
top drop's permutation p-value equals a plain loop over the draws; the mask zeroes exactly the chosen heads
(against a plain Hugging Face hook); the random draws are seeded, from the top heads' layers and never a top head;
the tables round-trip and resume; bad options are one line."""

import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner
from conftest import NEEDLE_ANSWER, NEEDLE_HAYSTACK, NEEDLE_QUESTION, assert_a_stopped_run_resumes, planted_needles

import headscan
from headscan.cli import cli
from headscan.errors import ConfigError
from headscan.retrieval_config import RetrievalConfig
from headscan.scan.masking import random_heads
from headscan.testing import build_architecture_checkpoint

ANSWER, QUESTION, HAYSTACK = NEEDLE_ANSWER, NEEDLE_QUESTION, NEEDLE_HAYSTACK
SMALL = {"lengths": (160,), "depths": (0.0, 0.5, 1.0), "bootstrap": 20}
MASK = {"mask_top": 1, "mask_random": 1}  # mask_draws: its default


def needles_file(path, openings) -> str:
    """Needles that differ in their opening words and share the planted question and answer."""
    path.write_text("".join(json.dumps({"needle": f"{opening} the three words are {ANSWER}.", "question": QUESTION,
                                        "answer": ANSWER}) + "\n" for opening in openings))
    return str(path)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A checkpoint whose answer reaches the logits only through its copying head L0H0, a haystack, its one needle
    (``one``) and four needles (``needles``)."""
    folder = tmp_path_factory.mktemp("masking")
    found = planted_needles(folder, through_head=True)
    return found | {"one": found["needles"], "needles": needles_file(folder / "four.jsonl", ["So", "Here", "Now", "Then"])}


@pytest.fixture(scope="module")
def masked_run(planted, tmp_path_factory):
    out = tmp_path_factory.mktemp("masked") / "out"
    return headscan.retrieval(planted["folder"], planted["haystack"], out, needles=planted["needles"], **SMALL, **MASK)


def test_masking_the_planted_retrieval_head_breaks_the_answer_and_a_random_other_head_does_not(planted, masked_run):
    trials = masked_run["retrieval_masking_trials"]
    layer, head = planted["head"]
    top = trials[trials["condition"] == "top"]
    assert (top["heads"] == f"L{layer}H{head}").all() and len(top) == 6  # 3 depths of the odd needles 1 and 3
    assert set(top["needle"]) == {1, 3} and set(trials["needle"]) == {1, 3}  # needles 0 and 2 chose the heads
    assert (top["value"] == 0.0).all() and not top["passed"].any()  # the answer never comes out
    assert (top["steps"] == RetrievalConfig().max_new_tokens).all()  # nor the newline that ends it
    others = trials[trials["condition"] == "random"]
    draws = RetrievalConfig().mask_draws
    assert draws >= 20 and len(others) == 6 * draws and not others["heads"].str.contains(f"L{layer}H{head}").any()
    assert (others["value"] == 1.0).all() and (others["response"] == ANSWER).all()
    none = trials[trials["condition"] == "none"]
    assert (none["value"] == 1.0).all() and (none["response"] == ANSWER).all()
    summary = masked_run["retrieval_masking"]
    pooled = summary[summary["length"].isna()].assign(draw=lambda f: f["draw"].fillna(-1))
    pooled = pooled.set_index(["condition", "draw"])
    assert pooled.loc[("none", -1), "value"] == 1.0 and np.isnan(pooled.loc[("none", -1), "drop"])
    assert pooled.loc[("top", -1), ["value", "drop", "drop_low", "drop_high"]].tolist() == [0.0, -1.0, -1.0, -1.0]
    assert pooled.loc[("random", -1), ["value", "drop"]].tolist() == [1.0, 0.0]
    assert (pooled["count"] == 6).all() and (pooled["units"] == 2).all()  # 6 trials, 2 needles: the unit
    assert pooled.loc[("top", -1), "p_value"] == pytest.approx(1 / (draws + 1))  # below every draw: the smallest p
    assert pooled.loc[("none", -1), ["p_value"]].isna().all()


def test_each_row_is_the_mean_over_its_trials_and_the_drop_is_paired(masked_run):
    """Independent of headscan's means: the per-trial table averaged with pandas, by condition and depth."""
    trials = masked_run["retrieval_masking_trials"].copy()
    summary = masked_run["retrieval_masking"]
    trials["draw"] = trials["draw"].fillna(-1)
    none = trials[trials["condition"] == "none"].set_index("trial")["value"]
    for row in summary[summary["draw"].notna() | (summary["condition"] != "random")].itertuples():
        part = trials[(trials["condition"] == row.condition) & (trials["draw"] == (-1 if pd.isna(row.draw) else row.draw))]
        if not pd.isna(row.depth):
            part = part[part["depth"] == row.depth]
        assert row.value == pytest.approx(part["value"].mean()) and row.count == len(part)
        if row.condition != "none":
            assert row.drop == pytest.approx((part.set_index("trial")["value"] - none[part["trial"]]).mean())


def test_the_tables_round_trip_through_load_with_their_provenance(masked_run):
    loaded = headscan.load(masked_run.path)
    assert set(loaded.frames) == {"retrieval", "retrieval_trials", "retrieval_masking", "retrieval_masking_trials"}
    for name in ("retrieval_masking", "retrieval_masking_trials"):
        pd.testing.assert_frame_equal(loaded[name], masked_run[name])
    masking = loaded.provenance.models[0].extra["masking"]
    assert masking["heads"]["top"] == ["L0H0"] and len([k for k in masking["heads"] if k.startswith("random")]) == 20
    assert "prefill" in masking["rule"] and "not measured" in masking["sink_induction_overlap"]
    assert (masking["choose_needles"], masking["mask_needles"]) == ([0, 2], [1, 3]) and "needle" in masking["unit"]
    assert "masking" in loaded.provenance.extra["retrieval"]


def test_the_mask_zeroes_exactly_the_chosen_heads_as_a_plain_hugging_face_hook_does(tmp_path):
    """headscan's mask on the model it loaded against a fresh Hugging Face model whose o_proj / c_proj input has
    the same columns zeroed by a hook written here; a grouped-query Llama and a GPT-2 (Conv1D)."""
    from transformers import AutoModelForCausalLM

    from headscan.models import load_model
    from headscan.models.ablation import head_cut, zeroed_heads
    from headscan.models.decode import language_model

    for name in ("llama", "gpt2"):
        folder = build_architecture_checkpoint(tmp_path / name, name)
        model = load_model(str(folder), device="cpu")
        chosen = [(0, 1), (model.n_layers - 1, 0), (model.n_layers - 1, model.n_heads - 1)]
        ids = torch.randint(10, 200, (1, 12))
        reference = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        layers = reference.model.layers if name == "llama" else reference.transformer.h
        d_head = reference.config.hidden_size // reference.config.num_attention_heads

        def zero(heads):
            def hook(module, args):
                x = args[0].clone()
                for head in heads:
                    x[..., head * d_head:(head + 1) * d_head] = 0.0
                return (x,)
            return hook

        handles = []
        for layer in {layer for layer, _ in chosen}:
            projection = layers[layer].self_attn.o_proj if name == "llama" else layers[layer].attn.c_proj
            handles.append(projection.register_forward_pre_hook(zero([h for at, h in chosen if at == layer])))
        with torch.no_grad():
            expected = reference(ids).logits
        for handle in handles:
            handle.remove()
        with torch.no_grad():
            clean = reference(ids).logits
        lm = language_model(model)
        seen = []  # the tensor handed to the projection before the mask: never written into
        first = head_cut(model).modules[0].register_forward_pre_hook(lambda m, a: seen.append((a[0], a[0].clone())))
        with torch.no_grad(), zeroed_heads(model, head_cut(model), chosen, within=lm) as fired:
            got = lm(ids).logits
        first.remove()
        assert fired == {layer for layer, _ in chosen}
        assert (got - clean).abs().max() > 1e-3, name  # the heads matter, so the comparison says something
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(seen[0][0], seen[0][1])
        with torch.no_grad():
            assert torch.allclose(lm(ids).logits, clean, atol=1e-5)  # the hooks are gone after the block


def test_random_draws_are_seeded_from_the_top_heads_layers_and_never_a_top_head():
    top = [(3, 0), (3, 4), (7, 2), (1, 8)]
    excluded = set(top) | {(3, 5)}  # a head ranked above --mask-random's count stays out too
    draws = [random_heads(top, excluded, 9, seed=0, draw=d) for d in range(6)]
    for chosen in draws:
        assert Counter(layer for layer, _ in chosen) == Counter(layer for layer, _ in top)
        assert not set(chosen) & excluded and len(set(chosen)) == len(chosen)
    assert draws[0] == random_heads(top, excluded, 9, seed=0, draw=0)  # seeded
    assert len({tuple(d) for d in draws}) > 1 and draws[0] != random_heads(top, excluded, 9, seed=1, draw=0)
    with pytest.raises(ConfigError, match="layer 3 holds 2 of the top heads and only 1 other"):
        random_heads(top, excluded | {(3, h) for h in range(1, 8) if h != 4}, 9, seed=0, draw=0)


def test_a_stopped_masking_run_resumes_to_the_same_tables_and_other_mask_settings_are_refused(planted, masked_run,
                                                                                               tmp_path, monkeypatch):
    def run(out, **more):
        return headscan.retrieval(planted["folder"], planted["haystack"], out, needles=planted["needles"], **SMALL,
                                  **(MASK | more))

    # 12 unmasked trials, then 2 masked ones
    assert_a_stopped_run_resumes(run, lambda out: run(out, mask_draws=2), tmp_path / "part", stop_at=14,
                                 kept="2 masked trials kept", expected=masked_run,
                                 tables=("retrieval_masking", "retrieval_masking_trials"), monkeypatch=monkeypatch)


def test_heads_ranked_by_an_earlier_run_on_other_needles_are_the_ones_masked_on_every_trial(planted, masked_run,
                                                                                               tmp_path):
    other = needles_file(tmp_path / "other.jsonl", ["Well,", "Also"])
    again = headscan.retrieval(planted["folder"], planted["haystack"], needles=other, lengths=(160,), depths=(0.5,),
                               bootstrap=0, mask_top=2, mask_from=str(masked_run.path))
    masking = again.provenance.models[0].extra["masking"]
    ranked = masked_run["retrieval"]
    ranked = ranked[ranked["metric"] == "retrieval"].sort_values(["value", "layer", "head"], ascending=[False, True, True])
    assert masking["heads"]["top"] == ranked["label"].head(2).tolist()
    assert str(masked_run.path) in masking["ranked_by"] and len(masking["sha256"]) == 64
    assert set(again["retrieval_masking_trials"]["needle"]) == {0, 1}  # every needle of this run is masked


def test_the_split_ranks_heads_by_the_even_needles_trials_alone(planted, masked_run):
    """The heads the split chose against a plain mean over the even needles' passing trials of retrieval_trials."""
    from headscan.scan.masking import ranked_heads

    trials = masked_run["retrieval_trials"]
    even = trials[trials["needle"].isin([0, 2]) & trials["passed"] & trials["span_found"]]
    means = even.groupby(["layer", "head"], as_index=False)["value"].mean().assign(model=even["model"].iloc[0],
                                                                                 metric="retrieval")
    ranked, metric = ranked_heads(means, means["model"].iloc[0], 2, 4)
    top = masked_run.provenance.models[0].extra["masking"]["heads"]["top"]
    assert metric == "retrieval" and top == [f"L{ranked[0][0]}H{ranked[0][1]}"]


def test_the_top_drops_p_value_is_its_rank_among_the_draws_drops_by_a_plain_loop(masked_run):
    trials = masked_run["retrieval_masking_trials"]
    none = trials[trials["condition"] == "none"].set_index("trial")["value"]

    def drop(part):
        return float((part.set_index("trial")["value"] - none[part["trial"]]).mean())

    top = drop(trials[trials["condition"] == "top"])
    draws = [drop(part) for _, part in trials[trials["condition"] == "random"].groupby("draw")]
    at_least = 0
    for value in draws:
        if value <= top:
            at_least += 1
    summary = masked_run["retrieval_masking"]
    row = summary[(summary["condition"] == "top") & summary["length"].isna()].iloc[0]
    assert row["p_value"] == pytest.approx((1 + at_least) / (len(draws) + 1))
    for depth in (0.0, 0.5, 1.0):  # per depth too, on that depth's trials
        at = trials[trials["depth"] == depth]
        top_here = drop(at[at["condition"] == "top"])
        here = [drop(part) for _, part in at[at["condition"] == "random"].groupby("draw")]
        row = summary[(summary["condition"] == "top") & (summary["depth"] == depth)].iloc[0]
        assert row["p_value"] == pytest.approx((1 + sum(v <= top_here for v in here)) / (len(here) + 1))


@pytest.mark.parametrize("extra, message", [
    (["--mask-draws", "0"], "mask-draws must be a whole number >= 1"),
    (["--mask-from", "somewhere"], "mask-from names the scores to rank heads by, but nothing is masked"),
    (["--mask-top", "1", "--mask-from", "no-such-folder"], "no-such-folder: no such folder"),
    (["--mask-random", "4"], "layer 0 holds 4 of the top heads and only 0 other heads"),
    (["--mask-top", "5"], "5 heads asked for, but only 4 heads have a retrieval score"),
    (["--mask-top", "1", "--needles", "ONE"], "chooses heads on half the needles and masks the other half, and this run "
                                              "has 1 needle"),
    (["--mask-top", "1", "--mask-from", "MASKED"], "ran on this run's needles"),
])
def test_bad_mask_options_are_one_line(planted, masked_run, tmp_path, extra, message):
    extra = [{"ONE": planted["one"], "MASKED": str(masked_run.path)}.get(word, word) for word in extra]
    needles = [] if "--needles" in extra else ["--needles", planted["needles"]]
    result = CliRunner().invoke(cli, ["retrieval", "-m", planted["folder"], "--haystack", planted["haystack"],
                                      *needles, "--lengths", "160", "--depths", "0",
                                      "--bootstrap", "0", "-q", "--out", str(tmp_path / "out"), *extra])
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # no half-written output


def test_the_report_shows_accuracy_by_condition_with_the_drops_and_the_overlap_with_sink_and_induction(planted,
                                                                                                        masked_run,
                                                                                                        tmp_path):
    from headscan.report import write_report

    text = " ".join(HAYSTACK.split() * 4)
    headscan.sweep(planted["folder"], [text] * 16, tmp_path / "sweep", max_len=64, bootstrap=20)
    sweep = headscan.load(tmp_path / "sweep")
    folder = write_report([sweep, headscan.load(masked_run.path)], tmp_path / "report")
    section = (folder / "report.md").read_text()
    section = section[section.index("### Masking the retrieval heads"):]
    section = section[:section.index("\n## ")] if "\n## " in section else section
    assert "every trial (6 trials of 2 needles): none 1.00 [1.00, 1.00]; top 1 masked 0.00 [0.00, 0.00], drop -1.00 " \
        "[-1.00, -1.00]" in section
    assert "the top drop ranked among 20 random draws' drops: permutation p = 0.05 (the smallest 20 draws allow: 0.05)" in section
    assert "heads chosen on needles [0, 2], masked on the trials of needles [1, 3]" in section
    assert "random 1 masked 1.00 [1.00, 1.00], drop 0.00 [0.00, 0.00]" in section
    heads = sweep.heads
    for metric in ("first_token", "induction"):  # the overlap, counted here from heads.parquet
        ranked = heads[heads["metric"] == metric].sort_values("value", ascending=False, kind="stable")
        expected = int(ranked["label"].iloc[0] == "L0H0")
        name = "sink (first\\_token)" if metric == "first_token" else "induction"  # Markdown escapes the _
        assert f"{expected} among its 1 highest {name} heads" in section
    assert "| 160 | 0 | top | 1 | 0.00 [0.00, 0.00] | -1.00 [-1.00, -1.00] | 0% | 2 |" in section
    assert "| random 0 |" in section and "in the run's top" in section
    assert list(folder.glob("**/retrieval_masking_*.png"))


def test_retrieval_head_counts_rest_on_needles_with_a_t_test_and_benjamini_hochberg_as_scipy_computes_them():
    """retrieval_head_tests against scipy: a one-sided one-sample t-test over each head's needle means, and
    false_discovery_control (BH) over the heads; the needle means by a plain loop."""
    from scipy.stats import false_discovery_control, ttest_1samp

    from headscan.analysis.whole_context import retrieval_head_tests

    rng = np.random.default_rng(0)
    rows = []
    for trial in range(40):  # 8 needles x 5 depths, 6 heads of rising strength
        for head in range(6):
            rows.append({"model": "m", "layer": 1, "head": head, "label": f"L1H{head}", "trial": trial,
                         "needle": trial % 8, "value": float(np.clip(rng.normal(0.04 * head, 0.1), 0, 1)),
                         "passed": trial % 7 != 0, "span_found": trial % 11 != 0})
    trials = pd.DataFrame(rows)
    tests = retrieval_head_tests(trials, "m").set_index("label")
    kept = trials[trials["passed"] & trials["span_found"]]
    p = []
    for head in range(6):
        means = [kept[(kept["head"] == head) & (kept["needle"] == n)]["value"].mean() for n in range(8)]
        assert tests.loc[f"L1H{head}", "value"] == pytest.approx(np.mean(means))
        p.append(ttest_1samp(means, 0.1, alternative="greater").pvalue)
    np.testing.assert_allclose(tests["p_value"].to_numpy(), p, rtol=1e-6)
    np.testing.assert_allclose(tests["q_value"].to_numpy(), false_discovery_control(p), rtol=1e-6)
    assert (tests["ci_low"] <= tests["value"]).all() and (tests["value"] <= tests["ci_high"]).all()
