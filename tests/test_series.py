"""Checkpoint series: a folder of checkpoints named by step, swept and reported; ID@REVISION from the
Hugging Face cache; the step at which a head forms.

The series is built in tmp: two checkpoints of `headscan.testing.training.train_series` (a few optimiser steps:
their heads hold no role) and two of `build_planted_checkpoint` (layer-0 head 0 attends to the previous token
by construction). So the previous-token head L0H0 forms at step 10 and no head forms before: a planted answer.
The formation step is also checked against the rule worked out in a plain loop over the table's rows, and
each checkpoint's revision against a sha256 of its weight file computed here.
"""

import hashlib
import shutil

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from headscan.analysis.runs import compare_runs
from headscan.analysis.series import HOLD, checkpoint_steps, formation, half_rise, with_steps
from headscan.cli import cli
from headscan.errors import ConfigError
from headscan.models.series import checkpoint_series
from headscan.plots.series import trajectories
from headscan.report import sections
from headscan.report.atlas import atlas_data
from headscan.report.sections.training import report_steps
from headscan.tables import load, thin_rows
from headscan.testing import build_planted_checkpoint
from headscan.testing.training import TrainConfig, train_series

TINY = TrainConfig(d_model=64, n_heads=4, seq_len=24, run_min=3, run_max=8, batch_size=4, steps=3, save_at=(0, 3),
                   eval_size=4)


SLOW_SECTIONS = [(sections.heatmaps, "heatmaps_section"), (sections.offsets, "offsets_section"),
                 (sections.scatter, "prev_next_section"), (sections.scatter, "entropy_section"),
                 (sections.context, "context_section"), (sections.movement, "movement_section")]


@pytest.fixture(scope="module")
def series(tmp_path_factory):
    root = tmp_path_factory.mktemp("series")
    log = train_series(root / "run", TINY)
    for step in (10, 20):
        build_planted_checkpoint(root / "run" / f"step-{step}")
    out, report = root / "out", root / "report"
    runner = CliRunner()
    swept = runner.invoke(cli, ["sweep", "--checkpoints", str(root / "run"), "-c", "repeat-random:n=8,count=100",
                                "--max-len", "32", "--bootstrap", "50", "--out", str(out), "-q"])
    assert swept.exit_code == 0, swept.output
    with pytest.MonkeyPatch.context() as patch:  # the sections this file does not test take 40 of the report's 50 s
        for module, name in SLOW_SECTIONS:
            patch.setattr(module, name, lambda *args, **kwargs: [])
        reported = runner.invoke(cli, ["report", str(out), "--no-models", "--out", str(report), "-q"])
    assert reported.exit_code == 0, reported.output
    return {"root": root, "log": log, "tables": load(out), "report": report}


def test_a_series_of_checkpoints_sweeps_with_step_and_revision_in_each_models_provenance(series):
    models = series["tables"].provenance.models
    assert [m.step for m in models] == [0, 3, 10, 20]
    for model in models:
        weights = (series["root"] / "run" / f"step-{model.step}" / "model.safetensors").read_bytes()
        assert model.revision == "sha256:" + hashlib.sha256(weights).hexdigest()
        assert model.name.endswith(f"step-{model.step}")
    assert [r["step"] for r in series["log"]] == [0, 3]
    assert (series["root"] / "run" / "training.jsonl").is_file()
    steps = checkpoint_steps(models)
    assert steps["series"].unique().tolist() == ["run"] and steps["step"].tolist() == [0, 3, 10, 20]



def test_two_runs_in_folders_of_one_name_are_two_series():
    from headscan.tables import ModelProvenance

    def checkpoint(folder, step, source="local"):
        return ModelProvenance(f"{folder}/step-{step}", id=f"{folder}/step-{step}", source=source, step=step)

    models = [checkpoint("/runs/a/tiny", 0), checkpoint("/runs/a/tiny", 5), checkpoint("/runs/b/tiny", 0),
              checkpoint("/runs/b/tiny", 5), checkpoint("/data/small", 1),
              ModelProvenance("org/tiny@step7", id="org/tiny", source="huggingface", step=7)]
    steps = checkpoint_steps(models)
    assert steps["series"].tolist() == ["a/tiny", "a/tiny", "b/tiny", "b/tiny", "small", "org/tiny"]
    assert steps.groupby("series", sort=False)["step"].apply(list).to_dict() == {
        "a/tiny": [0, 5], "b/tiny": [0, 5], "small": [1], "org/tiny": [7]}
    # a local run whose short name would be a hub id's keeps more of its path
    mixed = checkpoint_steps([checkpoint("/d1/org/tiny", 1), checkpoint("/d2/xorg/tiny", 2), models[-1]])
    assert mixed["series"].tolist() == ["d1/org/tiny", "xorg/tiny", "org/tiny"]

def _formed_by_loop(heads: pd.DataFrame, steps: dict, metric: str, threshold: float, hold: int) -> dict:
    """The rule in plain Python: the first step whose interval's low end is >= threshold and > chance on support
    that is not thin (the table's own rule, `thin_rows`), at it and at the next `hold` checkpoints."""
    formed = {}
    rows = heads[heads["metric"] == metric]
    rows = rows.assign(thin=thin_rows(rows))
    for (layer, head), part in rows.groupby(["layer", "head"]):
        by_step = sorted((steps[row.model], row.ci_low, row.chance, row.thin) for row in part.itertuples())
        ok = [low >= threshold and low > chance and not thin for _, low, chance, thin in by_step]
        for i, (step, *_) in enumerate(by_step):
            if all(ok[i:i + hold + 1]):
                formed[(layer, head)] = step
                break
    return formed


def test_the_planted_previous_token_head_forms_at_the_first_planted_step(series):
    tables = series["tables"]
    steps = checkpoint_steps(tables.provenance.models)
    formed = formation(with_steps(tables.heads, steps))
    prev = formed[(formed["metric"] == "prev_token") & formed["step"].notna()]
    assert prev[["label", "step"]].to_dict("records")[0] == {"label": "L0H0", "step": 10.0}
    assert (prev["step"] >= 10).all()  # nothing forms in the barely trained checkpoints
    by_loop = _formed_by_loop(tables.heads, dict(zip(steps["model"], steps["step"])), "prev_token", 0.5, HOLD)
    assert {(r.layer, r.head): r.step for r in prev.itertuples()} == by_loop


def _half_rise_by_loop(rows: pd.DataFrame) -> dict:
    """Half rise in plain Python: per head and metric, the checkpoints in step order; start and final the first
    and last values that are not NaN; the first step whose ci_low is above half-way, if the last ci_low is above
    the first ci_high."""
    out = {}
    for key in sorted({(r.series, r.layer, r.head, r.metric) for r in rows.itertuples()}):
        part = sorted((r.step, r.value, r.ci_low, r.ci_high) for r in rows.itertuples()
                      if (r.series, r.layer, r.head, r.metric) == key)
        known = [p for p in part if not np.isnan(p[1])]
        step = np.nan
        if known and known[-1][2] > known[0][3]:
            level = (known[0][1] + known[-1][1]) / 2
            step = next((s for s, _, low, _ in part if low > level), np.nan)
        out[key] = step
    return out


def test_half_rise_equals_a_plain_loop_on_a_hand_built_table_with_flat_falling_and_nan_heads():
    nan = np.nan
    heads = {  # (series, layer, head, metric): (value, ci_low, ci_high) at steps 0, 2, 4, 6, 8
        ("a", 0, 0, "prev_token"): ([0.1, 0.2, 0.5, 0.8, 0.9], [0.05, 0.15, 0.45, 0.75, 0.85],
                                    [0.15, 0.25, 0.55, 0.85, 0.95]),  # rises: half-way 0.5, passed at 6
        ("a", 0, 1, "prev_token"): ([0.3, 0.3, 0.31, 0.3, 0.3], [0.2, 0.2, 0.21, 0.2, 0.2],
                                    [0.4, 0.4, 0.41, 0.4, 0.4]),  # flat: never rises
        ("a", 1, 0, "prev_token"): ([0.9, 0.7, 0.5, 0.3, 0.1], [0.85, 0.65, 0.45, 0.25, 0.05],
                                    [0.95, 0.75, 0.55, 0.35, 0.15]),  # falls
        ("a", 1, 1, "induction"): ([nan, 0.0, 0.2, 0.4, nan], [nan, 0.0, 0.15, 0.35, nan],
                                   [nan, 0.05, 0.25, 0.45, nan]),  # NaN at both ends: 0.0 to 0.4, past 0.2 at 6
        ("a", 1, 1, "prev_token"): ([0.1, 0.4, 0.2, 0.5, 0.5], [0.05, nan, 0.15, 0.45, 0.45],
                                    [0.15, nan, 0.25, 0.55, 0.55]),  # a NaN interval mid-way is not past
        ("b", 0, 0, "induction"): ([0.0, 0.6, 0.1, 0.3, 0.4], [0.0, 0.55, 0.05, 0.25, 0.35],
                                   [0.05, 0.65, 0.15, 0.35, 0.45]),  # a flicker at 2 is the first step past 0.2
        ("b", 0, 1, "induction"): ([nan] * 5, [nan] * 5, [nan] * 5),  # nothing measured
    }
    rows = pd.DataFrame([{"series": k[0], "layer": k[1], "head": k[2], "metric": k[3], "label": f"L{k[1]}H{k[2]}",
                          "step": step, "value": v, "ci_low": lo, "ci_high": hi}
                         for k, (values, lows, highs) in heads.items()
                         for step, v, lo, hi in zip(range(0, 10, 2), values, lows, highs)])
    rows = rows.sample(frac=1, random_state=0)  # any row order
    got = half_rise(rows)
    steps = {(r.series, r.layer, r.head, r.metric): r.step for r in got.itertuples()}
    loop = _half_rise_by_loop(rows)
    assert steps.keys() == loop.keys() == heads.keys()
    assert all(steps[k] == loop[k] or (np.isnan(steps[k]) and np.isnan(loop[k])) for k in loop)
    assert [steps[k] for k in heads] == pytest.approx([6, nan, nan, 6, 6, 2, nan], nan_ok=True)
    nan_head = got[(got["series"] == "a") & (got["layer"] == 1) & (got["metric"] == "induction")].iloc[0]
    assert (nan_head["start"], nan_head["final"], nan_head["level"]) == pytest.approx((0.0, 0.4, 0.2))
    assert (nan_head["value"], nan_head["ci_low"], nan_head["ci_high"]) == pytest.approx((0.4, 0.35, 0.45))


def test_half_rise_equals_a_plain_loop_on_random_trajectories():
    rng = np.random.default_rng(0)
    n_heads, steps = 12, [0, 10, 12, 14, 20, 50]
    value = np.cumsum(rng.normal(0.02, 0.1, (n_heads, len(steps))), axis=1)
    value[rng.random(value.shape) < 0.1] = np.nan
    width = rng.uniform(0.01, 0.1, value.shape)
    rows = pd.DataFrame({"series": "s", "layer": np.repeat(np.arange(n_heads) // 4, len(steps)),
                         "head": np.repeat(np.arange(n_heads) % 4, len(steps)), "metric": "induction",
                         "label": "L?H?", "step": steps * n_heads, "value": value.ravel(),
                         "ci_low": (value - width).ravel(), "ci_high": (value + width).ravel()})
    steps_found = {(r.series, r.layer, r.head, r.metric): r.step for r in half_rise(rows).itertuples()}
    loop = _half_rise_by_loop(rows)
    assert steps_found.keys() == loop.keys()
    assert all(steps_found[k] == loop[k] or (np.isnan(steps_found[k]) and np.isnan(loop[k])) for k in loop)
    assert 0 < sum(not np.isnan(s) for s in loop.values()) < n_heads  # some rise, some do not


def test_the_report_draws_each_heads_trajectory_and_lists_where_it_forms(series):
    text = (series["report"] / "report.md").read_text()
    part = text[text.index("## Heads over training"):]
    assert "4 checkpoints, steps 0, 3, 10, 20." in part
    assert "series_run_prev_token.png" in part and "series_run_induction.png" in part
    assert (series["report"] / "figures" / "series_run_prev_token.png").is_file()
    chance = sum(1 / (q + 1) for q in range(1, 17)) / 16  # uniform attention on BOS + 16 tokens, queries 1 .. 16
    assert f"| L0H0 | prev\\_token | previous-token | 10 | 1.000 | [1.000, 1.000] | {chance:.3f} |" in part
    assert "| L0H1 | first\\_token | sink | 10 |" in part  # the planted first-token head too


@pytest.mark.browser
def test_the_atlas_shows_one_grid_per_series_with_a_slider_over_its_steps(series, tmp_path):
    """One grid for the four checkpoints, the last step first; the planted L0H0 (a previous-token head from step 10)
    coloured otherwise at step 0; an open panel follows the slider to the same head; the search finds only the
    checkpoint shown."""
    from conftest import chromium_page

    tables = series["tables"]
    names = [m.name for m in tables.provenance.models]
    steps = report_steps(compare_runs([tables]))  # what the section "Heads over training" takes for a series
    assert atlas_data(compare_runs([tables]))["series"] == [
        {"name": "run", "steps": [0, 3, 10, 20], "models": [names.index(m) for m in steps["model"]]}]
    heads = tables.heads
    prev = heads[(heads["label"] == "L0H0") & (heads["metric"] == "prev_token")].set_index("model")["value"]
    with chromium_page(series["report"] / "index.html", tmp_path / "profile") as (page, errors):
        assert page.locator(".atlas-model[data-group]").count() == 1
        slider = page.locator("input.atlas-step")
        assert slider.get_attribute("max") == "3" and slider.input_value() == "3"
        assert page.inner_text(".atlas-step-shown").startswith("step 20")
        cell = page.locator('rect.atlas-cell[data-label="L0H0"]')
        assert cell.get_attribute("data-model") == names[3]
        at_20 = cell.get_attribute("fill")
        cell.click()
        panel = page.locator("#atlas-panel")
        assert panel.locator("h3").inner_text() == f"{names[3]} L0H0"
        value = panel.locator('tr[data-metric="prev_token"] td.value')
        assert float(value.get_attribute("data-value")) == pytest.approx(prev[names[3]], rel=1e-4)

        def step_to(position: int):
            slider.evaluate("(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }",
                            str(position))

        step_to(0)
        assert page.inner_text(".atlas-step-shown").startswith("step 0")
        assert page.locator('rect.atlas-cell[data-label="L0H0"]').get_attribute("fill") != at_20
        assert panel.locator("h3").inner_text() == f"{names[0]} L0H0"  # the panel followed
        assert "step 0" in panel.inner_text()
        assert float(value.get_attribute("data-value")) == pytest.approx(prev[names[0]], rel=1e-4)
        assert prev[names[0]] < 0.5 < prev[names[3]]
        page.fill("#atlas-search", "L0H0")
        assert page.inner_text("#atlas-found") == f"L0H0 in {names[0]} (Enter opens it)"
        assert page.locator("rect.atlas-cell.found").get_attribute("data-model") == names[0]
        step_to(2)  # the search follows the slider too
        assert page.inner_text("#atlas-found") == f"L0H0 in {names[2]} (Enter opens it)"
        assert page.locator("rect.atlas-cell.found").count() == 1
    assert errors == []


def test_trajectories_draws_one_line_per_head_and_a_marker_where_it_forms():
    rows = pd.DataFrame({"series": "s", "layer": [0, 0, 0, 1, 1, 1], "head": 0, "metric": "induction",
                         "label": ["L0H0"] * 3 + ["L1H0"] * 3, "step": [0, 5, 9] * 2,
                         "value": [0.0, 0.1, 0.1, 0.0, 0.6, 0.9], "ci_low": [0.0, 0.05, 0.05, 0.0, 0.5, 0.8],
                         "ci_high": [0.1, 0.2, 0.2, 0.1, 0.7, 1.0], "chance": 0.02})
    formed = formation(rows)
    fig, ax = plt.subplots()
    trajectories(rows, metric="induction", formed=formed, threshold=0.4, ax=ax)
    assert [line.get_label() for line in ax.lines] == ["L0H0", "L1H0", "chance", "threshold 0.4"]
    assert ax.collections[-1].get_offsets().tolist() == [[5.0, 0.6]]
    plt.close(fig)


def test_a_checkpoint_folder_not_named_by_step_is_refused_in_one_line(tmp_path):
    (tmp_path / "final").mkdir()
    (tmp_path / "final" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"final holds a checkpoint but its name says no step; name each"):
        checkpoint_series(tmp_path)
    result = CliRunner().invoke(cli, ["sweep", "--checkpoints", str(tmp_path / "nothing"), "-q"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"Error: --checkpoints: {tmp_path / 'nothing'} is not a folder; "
                                                  "pass the folder that holds the checkpoint folders (step1000, "
                                                  "step-1000, step_1000, checkpoint-1000 or checkpoint_1000)"]


def test_a_hugging_face_revision_loads_from_the_cache_offline_with_its_step(series, tmp_path, monkeypatch):
    import huggingface_hub.constants

    from headscan.models import load_model

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--org--tiny"
    shutil.copytree(series["root"] / "run" / "step-10", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "step10").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = load_model("org/tiny@step10").provenance()
    assert (model["name"], model["id"], model["revision"], model["step"], model["commit"]) == \
        ("org/tiny@step10", "org/tiny", "step10", 10, commit)
    with pytest.raises(Exception, match="revision 'step99' of 'org/tiny' is not in the local Hugging Face cache"):
        from headscan.models import check_spec

        check_spec("org/tiny@step99")
    assert np.isfinite(model["n_params"])
