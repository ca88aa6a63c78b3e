"""Each experiment script runs end to end on tiny checkpoints, writes its outputs, and says PASS or FAIL as its claim
holds or not: on planted checkpoints (heads that look where they look by construction) the answer is known, and on
random ones where the claim's threshold is out of reach, FAIL is.
"""

from pathlib import Path

import pandas as pd
import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """{arch: (folder, planted heads)}: GPT-2 and BERT checkpoints whose layer-0 heads are previous-token,
    next-token (BERT), first-token and offset -2 heads on any text."""
    from headscan.testing import build_planted_checkpoint

    return {arch: build_planted_checkpoint(tmp_path_factory.mktemp(f"planted-{arch}"), arch, n_layers=1)
            for arch in ("gpt2", "bert")}


def label(layer_head) -> str:
    return f"L{layer_head[0]}H{layer_head[1]}"


@pytest.fixture
def experiment(monkeypatch, load_script):
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the scripts import their _common module

    def load(name):
        return load_script(EXPERIMENTS / f"{name}.py", f"experiment_{name}")

    return load


def test_looking_both_ways(experiment, tiny_gpt2, tiny_bert, tmp_path, capsys):
    script = experiment("looking_both_ways")
    rc = script.main(["--model", str(tiny_gpt2), "--model", str(tiny_bert), "--no-literature", "--corpus", "builtin",
                      "--limit", "4", "--max-len", "32", "--out", str(tmp_path)])
    assert rc in (0, 1)
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert list(heads.metric) == ["prev_token", "next_token"]  # by family: causal, then bidirectional
    assert set(heads.check) <= {"PASS", "FAIL"} and (tmp_path / "profiles.png").stat().st_size > 0
    assert set(pd.read_csv(tmp_path / "profiles.csv").offset) == set(range(-8, 9))
    assert "| model |" in (tmp_path / "README.md").read_text()
    assert "PASS" in capsys.readouterr().out or rc == 1


def test_looking_both_ways_skips_models_that_are_not_here(experiment, tiny_bert, tmp_path, capsys, monkeypatch):
    script = experiment("looking_both_ways")
    monkeypatch.setattr(script, "weights_present", lambda spec: spec == str(tiny_bert))
    script.main(["--model", str(tiny_bert), "--corpus", "builtin", "--limit", "3", "--max-len", "32", "--out", str(tmp_path)])
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert heads.set_index("model").loc[["gpt2", "bert-base-uncased"], "check"].tolist() == ["SKIP", "SKIP"]
    assert "SKIP gpt2" in capsys.readouterr().out


def test_positional_vs_content(experiment, tiny_gpt2, tiny_bert, tmp_path):
    script = experiment("positional_vs_content")
    rc = script.main(["--model", str(tiny_gpt2), "--model", str(tiny_bert), "--corpus", "builtin", "--limit", "4",
                      "--max-len", "48", "--out", str(tmp_path)])
    assert rc in (0, 1)
    heads = pd.read_csv(tmp_path / "heads.csv")
    assert {"natural", "shuffled", "random", "kind"} <= set(heads.columns)
    assert len(heads) == 2 * 2 * 2 * 4  # models x metrics x layers x heads
    for name in ("natural.txt", "shuffled.txt", "scatter.png", "README.md"):
        assert (tmp_path / name).stat().st_size > 0
    natural = (tmp_path / "natural.txt").read_text().split("\n")[0].split()
    assert sorted(natural) == sorted((tmp_path / "shuffled.txt").read_text().split("\n")[0].split())


def test_mask_is_the_difference(experiment, tiny_gpt2, tiny_bert, tmp_path, capsys):
    script = experiment("mask_is_the_difference")
    rc = script.main(["--model", str(tiny_gpt2), "--model", str(tiny_bert), "--no-literature", "--corpus", "builtin",
                      "--limit", "4", "--max-len", "24", "--out", str(tmp_path)])
    assert rc in (0, 1)
    layers = pd.read_csv(tmp_path / "layers.csv")
    shares = layers[["back", "self", "ahead"]].sum(1)
    assert ((shares - 1).abs() < 1e-5).all()  # the whole offset profile: every query's attention, once
    causal = layers[layers.family == "causal"]
    assert (causal.ahead.abs() < 1e-6).all()
    out = capsys.readouterr().out
    assert "PASS" in out and "largest share ahead" in out  # the structural zero holds even for random weights
    assert set(pd.read_csv(tmp_path / "heads.csv")["class"]) <= {"back", "self", "ahead", "sink"}
    assert (tmp_path / "layers.png").stat().st_size > 0


def test_clark_syntax(experiment, tiny_bert, ewt_dev, tmp_path, capsys):
    script = experiment("clark_syntax")
    rc = script.main(["--model", str(tiny_bert), "--corpus", str(ewt_dev), "--limit", "6", "--max-len", "64",
                      "--out", str(tmp_path)])
    assert rc in (0, 1)
    best = pd.read_csv(tmp_path / "best_heads.csv")
    assert {"all", "det", "nsubj"} <= set(best.relation) and best.clark_accuracy.notna().any()
    assert (tmp_path / "best_heads.png").stat().st_size > 0 and "Clark" in (tmp_path / "README.md").read_text()


def test_clark_syntax_refuses_a_corpus_without_trees(experiment, tmp_path, capsys):
    assert experiment("clark_syntax").main(["--corpus", "builtin", "--out", str(tmp_path)]) == 2
    assert "CoNLL-U" in capsys.readouterr().out


def test_top_heads_prints_a_markdown_table(experiment, tiny_gpt2, tmp_path, capsys, monkeypatch):
    import headscan

    headscan.sweep(str(tiny_gpt2), "builtin", tmp_path / "run", limit=3, max_len=32, bootstrap=0)
    monkeypatch.setattr("sys.argv", ["top_heads.py", str(tmp_path / "run"), "--metric", "prev_token", "--top", "2"])
    experiment("top_heads").main()
    out = capsys.readouterr().out
    assert "(corpus: builtin)" in out and out.count("| prev_token |") == 2


def test_read_as_written(experiment, tiny_gpt2, ewt_dev, tmp_path):
    script = experiment("read_as_written")
    rc = script.main(["--model", str(tiny_gpt2), "--corpus", str(ewt_dev), "--limit", "6", "--max-len", "64",
                      "--out", str(tmp_path)])
    frame = pd.read_csv(tmp_path / "differences.csv")
    assert rc == 0 and list(frame.table) == ["heads", "offsets", "value"] and (frame.result == "PASS").all()
    assert (frame.max_count_difference == 0).all() and "multiword tokens" in (tmp_path / "README.md").read_text()
    assert not (tmp_path / "sentences.txt").exists()


def test_looking_both_ways_passes_on_planted_heads_and_fails_below_the_threshold(experiment, planted, tiny_gpt2,
                                                                                 tmp_path, capsys):
    (gpt2, gpt2_heads), (bert, bert_heads) = planted["gpt2"], planted["bert"]
    script = experiment("looking_both_ways")
    common = ["--no-literature", "--corpus", "builtin", "--limit", "6", "--max-len", "32"]
    rc = script.main(["--model", str(gpt2), "--model", str(bert), *common, "--out", str(tmp_path / "planted")])
    heads = pd.read_csv(tmp_path / "planted" / "heads.csv").set_index("metric")
    assert rc == 0 and list(heads.check) == ["PASS", "PASS"]
    assert heads.loc["prev_token", "label"] == label(gpt2_heads["prev_token"])  # the planted heads, found
    assert heads.loc["next_token", "label"] == label(bert_heads["next_token"])
    assert (heads.value > 0.99).all()
    # a random GPT-2's best previous-token head is far below 0.5: the claim fails, and the script says so
    rc = script.main(["--model", str(tiny_gpt2), *common, "--out", str(tmp_path / "random")])
    (row,) = pd.read_csv(tmp_path / "random" / "heads.csv").itertuples()
    assert row.value < 0.5 and row.check == "FAIL" and rc == 1
    assert f"FAIL {tiny_gpt2} {row.label} prev_token = {row.value:.3f}" in capsys.readouterr().out


def test_positional_vs_content_passes_on_planted_positional_heads(experiment, planted, tmp_path, capsys):
    (gpt2, gpt2_heads), (bert, bert_heads) = planted["gpt2"], planted["bert"]
    rc = experiment("positional_vs_content").main(["--model", str(gpt2), "--model", str(bert), "--corpus", "builtin",
                                                   "--limit", "6", "--max-len", "48", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("PASS") == 3 and "FAIL" not in out  # GPT-2's prev, BERT's prev and next
    heads = pd.read_csv(tmp_path / "heads.csv")
    planted_rows = [(str(gpt2), "prev_token", gpt2_heads["prev_token"]), (str(bert), "prev_token", bert_heads["prev_token"]),
                    (str(bert), "next_token", bert_heads["next_token"])]
    for model, metric, (layer, head) in planted_rows:
        (row,) = heads[(heads.model == model) & (heads.metric == metric) & (heads.layer == layer)
                       & (heads["head"] == head)].itertuples()
        assert row.kind == "positional" and min(row.natural, row.shuffled, row.random) > 0.99


def test_mask_is_the_difference_passes_where_the_mask_decides(experiment, tiny_gpt2, tiny_bert, tmp_path, capsys):
    """A causal model puts nothing ahead whatever its weights; a random encoder's near-uniform attention puts about
    half ahead in every layer: both checks PASS, and the script exits 0."""
    rc = experiment("mask_is_the_difference").main(["--model", str(tiny_gpt2), "--model", str(tiny_bert),
                                                    "--no-literature", "--corpus", "builtin", "--limit", "4",
                                                    "--max-len", "24", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    layers = pd.read_csv(tmp_path / "layers.csv")
    encoder = layers[layers.family == "bidirectional"]
    assert (encoder.ahead > 0.1).all() and (layers[layers.family == "causal"].ahead.abs() <= 1e-6).all()
    assert rc == 0 and out.count("PASS") == 2 and "FAIL" not in out


def test_atp_vs_ablation_writes_run_json_and_from_heads_rewrites_the_same_readme_keeping_the_notes(
        experiment, tiny_gpt2, tmp_path, capsys):
    import json

    script = experiment("atp_vs_ablation")
    run = tmp_path / "run"
    rc = script.main(["--model", str(tiny_gpt2), "--corpus", "builtin", "--limit", "4", "--max-len", "32",
                      "--bootstrap", "20", "--out", str(run)])
    assert rc in (0, 1)
    heads = pd.read_csv(run / "heads.csv")
    assert len(heads) == 2 * 4 and {"atp_mean", "mean_ablation_ci_low", "zero_ablation"} <= set(heads.columns)
    settings = json.loads((run / "run.json").read_text())
    assert {key: settings[key] for key in ("corpus", "limit", "max_len", "batch_size", "bootstrap", "device",
                                           "target")} == {"corpus": "builtin", "limit": 4, "max_len": 32,
                                                          "batch_size": 16, "bootstrap": 20, "device": "cpu",
                                                          "target": "next_token_loss"}
    assert settings["model"] == heads["model"].iloc[0] and settings["headscan_version"]
    assert settings["command"].endswith("--bootstrap 20 --out " + str(run)) and "ablated" not in settings["importance"]
    # AtP* ran on the sweep's own sentences, means and positions: its plain AtP is the sweep's atp_mean
    assert heads["atp_star"].notna().all() and (heads["atp_star"] >= 0).all()
    assert settings["atp_star"]["atp_check"] <= 1e-6 * heads["atp_mean"].abs().max()
    written = (run / "README.md").read_text()
    assert "| every head | 8 |" in written and "| layers 1 and up | 4 |" in written
    assert script.EMPTY_NOTES in written
    # a hand-written section survives; the rest comes back byte for byte, and the scatter is drawn again
    notes = "## What the number says\n\nWritten by hand, after the run.\n"
    edited = written.replace(script.EMPTY_NOTES, notes)
    (run / "README.md").write_text(edited)
    (run / "scatter.png").unlink()
    assert script.main(["--from-heads", str(run)]) == rc
    assert (run / "README.md").read_text() == edited and (run / "scatter.png").stat().st_size > 0
    # elsewhere: heads.csv and run.json copied beside the README, which has no notes there yet
    assert script.main(["--from-heads", str(run), "--out", str(tmp_path / "copy")]) == rc
    assert (tmp_path / "copy" / "README.md").read_text() == written
    assert (tmp_path / "copy" / "run.json").read_text() == (run / "run.json").read_text()


def _plain_ranks(values):
    return [1 + sum(v < x for v in values) + (sum(v == x for v in values) - 1) / 2 for x in values]


def _plain_pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / (sxx * syy) ** 0.5


def _heads_table(seed=0):
    """15 heads (3 layers x 5) of heads.csv's shape, with ties, one missing atp_zero and intervals that exclude 0
    for some heads."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rows = []
    for layer in range(3):
        for head in range(5):
            exact = round(float(rng.normal(0, 0.1)), 2)  # rounded: ties
            rows.append({"model": "m", "layer": layer, "head": head, "label": f"L{layer}H{head}",
                         "atp_mean": exact + float(rng.normal(0, 0.1 if layer == 0 else 0.02)),
                         "atp_zero": float(rng.normal(0, 0.1)), "mean_ablation": exact,
                         "zero_ablation": exact * 2 + float(rng.normal(0, 0.05)),
                         "mean_ablation_ci_low": exact - 0.05, "mean_ablation_ci_high": exact + 0.05})
    rows[7]["atp_zero"] = float("nan")
    return pd.DataFrame(rows)


def test_atp_agreement_over_subsets_equals_a_plain_computation(experiment):
    import math

    heads = _heads_table()
    got = experiment("atp_vs_ablation").subsets(heads).set_index("heads")
    records = heads.to_dict("records")
    by_size = sorted(range(len(records)), key=lambda i: -abs(records[i]["mean_ablation"]))
    members = {
        "every head": list(range(15)),
        "layers 1 and up": [i for i, r in enumerate(records) if r["layer"] >= 1],
        "layers 2 and up": [i for i, r in enumerate(records) if r["layer"] >= 2],
        "exact effect's 95% interval excludes 0": [i for i, r in enumerate(records)
                                                   if r["mean_ablation_ci_low"] > 0 or r["mean_ablation_ci_high"] < 0],
        "the fifth with the largest exact effects": by_size[:3],
    }
    assert 0 < len(members["exact effect's 95% interval excludes 0"]) < 15
    assert list(got.index) == list(members)
    for name, chosen in members.items():
        rows = [records[i] for i in chosen]
        zero = [r for r in rows if not math.isnan(r["atp_zero"])]
        expected = {
            "n": len(rows),
            "Spearman (mean)": _plain_pearson(_plain_ranks([r["atp_mean"] for r in rows]),
                                              _plain_ranks([r["mean_ablation"] for r in rows])),
            "Spearman (zero)": _plain_pearson(_plain_ranks([r["atp_zero"] for r in zero]),
                                              _plain_ranks([r["zero_ablation"] for r in zero])),
            "Pearson (mean)": _plain_pearson([r["atp_mean"] for r in rows], [r["mean_ablation"] for r in rows]),
        }
        for column, value in expected.items():
            assert got.loc[name, column] == pytest.approx(value, abs=1e-12), (name, column)


def test_atp_star_recall_and_ranks_equal_a_plain_computation(experiment):
    import numpy as np

    script = experiment("atp_vs_ablation")
    heads = _heads_table(seed=3)
    heads["atp_star"] = np.abs(heads["mean_ablation"]) + np.abs(np.random.default_rng(1).normal(0, 0.03, len(heads)))
    got = script.star_table(heads).set_index("estimate")
    records = heads.to_dict("records")

    def top(key, k):
        return set(sorted(range(len(records)), key=lambda i: -abs(records[i][key]))[:k])

    for name, key, signed in (("AtP (atp_mean)", "atp_mean", True), ("abs(AtP)", "atp_mean", False),
                              ("AtP* (atp_star)", "atp_star", False)):
        estimate = [r[key] if signed else abs(r[key]) for r in records]
        exact = [r["mean_ablation"] if signed else abs(r["mean_ablation"]) for r in records]
        rho = _plain_pearson(_plain_ranks(estimate), _plain_ranks(exact))
        assert got.loc[name, "Spearman"] == pytest.approx(rho, abs=1e-12), name
        for k, column in ((10, "top-10 recall"), (20, "top-20 recall")):
            n = min(k, len(records))
            assert got.loc[name, column] == f"{len(top(key, n) & top('mean_ablation', n))} of {n}", (name, k)
    settings = {"model": "m", "corpus": "builtin", "limit": 4, "max_len": 32, "batch_size": 16, "device": "cpu",
                "minutes": 0.5, "target": "next_token_loss", "atp_star": {"minutes": 0.2, "atp_check": 1e-9}}
    text = script.readme_text(heads, settings)
    assert "## AtP* (GradDrop) beside AtP" in text and "| AtP* (atp_star) | abs(mean_ablation) |" in text
    assert "## AtP* (GradDrop)" not in script.readme_text(heads.drop(columns="atp_star"), settings)


def test_atp_readme_says_by_how_much_and_which_layers_where_the_bar_is_missed(experiment):
    script = experiment("atp_vs_ablation")
    heads = _heads_table()
    heads.loc[heads.layer == 0, "atp_mean"] = -heads.loc[heads.layer == 0, "mean_ablation"] * 10  # early misses
    settings = {"model": "m", "corpus": "builtin", "limit": 4, "max_len": 32, "batch_size": 16, "device": "cpu",
                "minutes": 0.5, "target": "next_token_loss"}
    text = script.readme_text(heads, settings, notes="kept")
    rho = _plain_pearson(_plain_ranks(list(heads.atp_mean)), _plain_ranks(list(heads.mean_ablation)))
    assert rho < script.BAR
    assert f"**FAIL** ({rho:.3f}), {script.BAR - rho:.3f} short of the bar." in text
    assert "## By how much, and where" in text
    misses = heads.assign(miss=heads.atp_mean - heads.mean_ablation).sort_values("miss", key=abs, ascending=False)
    early = int((misses.head(10).layer <= 1).sum())
    assert f"{early} of the 10 heads AtP misjudges most are in layers 0 and 1." in text
    worst_layer0 = misses[misses.layer == 0].head(10)
    row = (f"| 0 | {len(worst_layer0)} | {', '.join(worst_layer0.label)} | "
           f"{worst_layer0.miss.abs().max():.4f} |")
    assert row in text
    assert text.endswith("<!-- notes -->\nkept\n<!-- /notes -->\n")
    # where the bar is met, no shortfall
    assert "By how much" not in script.readme_text(heads.assign(atp_mean=heads.mean_ablation), settings)


def test_atp_from_heads_asks_for_the_run_json_fields_it_needs(experiment, tmp_path):
    import json

    script = experiment("atp_vs_ablation")
    _heads_table().to_csv(tmp_path / "heads.csv", index=False)
    with pytest.raises(FileNotFoundError, match="run.json not found"):
        script.main(["--from-heads", str(tmp_path)])
    (tmp_path / "run.json").write_text(json.dumps({"model": "m", "corpus": "builtin"}))
    with pytest.raises(ValueError, match="lacks limit, max_len, batch_size, device, minutes, target"):
        script.main(["--from-heads", str(tmp_path)])
    settings = {"model": "m", "corpus": "builtin", "limit": 4, "max_len": 32, "batch_size": 4, "device": "cpu",
                "minutes": 0.1, "target": "next_token_loss"}
    (tmp_path / "run.json").write_text(json.dumps(settings))
    # a README without the notes markers may hold hand-written text: refused, and left as it was
    (tmp_path / "README.md").write_text("# by hand\n")
    with pytest.raises(ValueError, match="has no <!-- notes --> ... <!-- /notes --> section"):
        script.main(["--from-heads", str(tmp_path)])
    assert (tmp_path / "README.md").read_text() == "# by hand\n"


def test_induction_formation_runs_end_to_end_on_a_few_steps(experiment, tmp_path, capsys):
    """Four optimiser steps: nothing forms, so FAIL, and every output is written with the half-rise order."""
    script = experiment("induction_formation")
    rc = script.main(["--steps", "4", "--bootstrap", "20", "--out", str(tmp_path / "out"), "--work",
                      str(tmp_path / "work")])
    assert rc == 1 and "FAIL" in capsys.readouterr().out
    for name in ("README.md", "induction_formation.png", "formation.csv", "half_rise.csv", "trajectories.csv",
                 "training.csv"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert pd.read_csv(tmp_path / "out" / "training.csv")["step"].tolist() == [0, 4]
    assert set(pd.read_csv(tmp_path / "out" / "trajectories.csv")["model"]) == {"series/step-0", "series/step-4"}
    halves = pd.read_csv(tmp_path / "out" / "half_rise.csv")
    assert len(halves) == 2 * 8 and set(halves.metric) == {"prev_token", "induction"}  # 8 heads, 2 metrics
    text = (tmp_path / "out" / "README.md").read_text()
    assert "Half rise (`headscan.analysis.series.half_rise`)" in text and "in half-rise order" in text
    assert "every 2 steps from 150 to 260" in text


def test_induction_formation_saves_every_2_steps_in_the_dense_window_and_reads_the_fall_per_10_steps(experiment):
    script = experiment("induction_formation")
    points = script.schedule(500)
    assert points == tuple(sorted({*range(0, 401, 10), *range(150, 261, 2), 500}))
    assert len(points) == 86 and {b - a for a, b in zip(points, points[1:]) if 150 <= a < 260} == {2}
    # the fall per checkpoint would be 0.3 at each 2-step checkpoint, below a tenth of the fall (0.6): per 10 steps it
    # is 1.5, above; the 10-step drop from 40 to 50 is 0.3, below.
    log = pd.DataFrame({"step": [0, 10, 20, 22, 24, 26, 28, 30, 40, 50],
                        "repeat_loss": [6.0, 6.0, 6.0, 5.7, 5.4, 5.1, 4.8, 0.6, 0.3, 0.0]})
    assert script.drop_window(log) == (22, 30)


def test_induction_formation_says_which_circuit_passes_half_its_rise_first(experiment):
    """A hand-built half-rise table: a weak layer-0 previous-token score moves first, the induction head next,
    the strong previous-token head (the one that forms) after it, one induction head late."""
    script = experiment("induction_formation")
    heads = [(0, 0, "prev_token", 192.0, 0.29), (0, 2, "prev_token", 202.0, 0.80), (1, 3, "induction", 198.0, 0.93),
             (1, 1, "induction", 232.0, 0.66), (0, 1, "prev_token", float("nan"), 0.07),
             (1, 0, "prev_token", 150.0, 0.5)]  # layer 1's previous-token score is not the circuit's
    halves = pd.DataFrame([{"series": "s", "layer": layer, "head": head, "metric": metric, "label": f"L{layer}H{head}",
                            "start": 0.05, "final": final, "level": (0.05 + final) / 2, "step": step,
                            "value": 0.5, "ci_low": 0.4, "ci_high": 0.6} for layer, head, metric, step, final in heads])
    formed = halves[["series", "layer", "head", "metric"]].assign(step=[float("nan"), 206.0, 194.0, 246.0,
                                                                        float("nan"), float("nan")])
    order = script.circuit(halves, formed)
    assert order["label"].tolist() == ["L0H0", "L1H3", "L0H2", "L1H1", "L0H1"]  # never-rising last
    lines = script.who_moves_first(order, (180, 204))
    assert lines[0] == ("half rise, previous-token scores of layer 0: L0H0 192 (0.05 to 0.29), "
                        "L0H2 202 (0.05 to 0.80)")
    assert lines[2] == ("by half rise the previous-token scores move first: L0H0 at step 192 (it ends at 0.29), "
                        "the first induction head L1H3 6 steps later, at 198")
    assert lines[4] == ("so among the heads that form, the first induction head passes half its rise at step 198 "
                        "(L1H3) and the first previous-token head at 202 (L0H2), 4 steps apart")
    assert lines[5] == ("3 of the 4 rising heads of the two circuits pass half their rise inside the phase change "
                        "(steps 180 to 204), between steps 192 and 202; outside it: L1H1 232")


def test_controls_gate_counts_findings_per_metric_and_checks_the_controls_share(experiment):
    gate = experiment("controls_gate")
    heads = pd.DataFrame({"model": ["m", "m", "m", "m [random init]", "m [random init 2]"],
                          "metric": ["prev_token", "prev_token", "self", "prev_token", "prev_token"],
                          "finding": pd.array([True, True, pd.NA, False, True], dtype="boolean")})
    counts = gate.finding_counts({"heads": heads}, "run")
    got = counts.set_index(["model", "metric"])["findings"].to_dict()
    assert got == {("m", "prev_token"): 2, ("m", "self"): 0, ("m [random init]", "prev_token"): 0,
                   ("m [random init 2]", "prev_token"): 1}
    assert counts.set_index("model")["trained"].to_dict() == {"m": True, "m [random init]": False,
                                                              "m [random init 2]": False}
    verdicts = gate.check(counts).set_index("metric")
    # one control finding against 2 trained ones is 50%, above 5%; none against none passes
    assert verdicts.loc["prev_token", "most_by_a_control"] == 1 and not verdicts.loc["prev_token", "ok"]
    assert verdicts.loc["self", "ok"]
