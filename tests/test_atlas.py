"""The head atlas: roles and ranks from the numbers, the data the page embeds, and the page in a real browser.

The browser test drives headless Chromium (Debian's /usr/bin/chromium, through the `playwright` package; it
never downloads a browser) over the committed EWT run, whose minilm L0H2 is a previous-token head.
"""

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import CHROMIUM_FLAGS, playwright_or_skip

from headscan import load
from headscan.analysis.runs import compare_runs
from headscan.report import atlas
from headscan.report.document import Document, Heading, Raw, to_html
from headscan.report.examples import Examples, HeadPatterns

ROOT = Path(__file__).resolve().parents[1]
EWT_RUN = ROOT / "reports" / "runs" / "ewt-dev"


def heads_frame(rows):
    """heads rows from (model, family, layer, head, metric, value[, ci_low, ci_high, units]) tuples; by default
    an interval of value +- 0.01, chance 0.05 (below every role's threshold) and support that is not thin."""
    records = []
    for model, family, layer, head, metric, value, *rest in rows:
        low, high, units = (rest + [np.nan, np.nan, 400.0])[:3] if rest else (value - 0.01, value + 0.01, 400.0)
        records.append(dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}",
                            kv_group=head, metric=metric, value=value, sum=value, count=1.0, ci_low=low,
                            ci_high=high, units=units, top_unit_share=0.01, chance=0.05))
    return pd.DataFrame(records)


# --- roles and ranks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scores, roles", [
    ({"prev_token": 0.93, "positional_prev": 0.95}, ["previous-token", "positional"]),
    ({"prev_token": 0.49, "positional_prev": 0.89}, []),  # just under both thresholds
    ({"next_token": 0.5}, ["next-token"]),  # a threshold holds at equality
    ({"first_token": 0.7, "entropy_norm": 0.85}, ["sink", "broad"]),
    ({"sep": 0.6}, ["sink"]),
    # attention alone makes an induction-like head prefix-matching (tests/test_claims.py gives it copying evidence)
    ({"induction": 0.8, "duplicate_token": 0.41, "prev_token": 0.6}, ["prefix-matching", "duplicate", "previous-token"]),
    ({"self": 0.7}, ["self"]),
])
def test_roles_follow_the_stated_thresholds(scores, roles):
    heads = heads_frame([("m", "causal", 0, 0, metric, value) for metric, value in scores.items()])
    found = atlas.head_roles(heads)
    assert found["roles"].tolist() == [roles]
    assert found["role"].tolist() == [roles[0] if roles else ""]


def test_a_value_on_thin_support_gives_no_role():
    heads = heads_frame([("m", "causal", 0, 0, "prev_token", 0.9, 0.89, 0.91, 5.0),
                         ("m", "causal", 0, 1, "prev_token", 0.9)])
    assert atlas.head_roles(heads)["roles"].tolist() == [[], ["previous-token"]]


def test_a_value_at_chance_gives_no_role():
    heads = heads_frame([("m", "causal", 0, 0, "first_token", 0.6), ("m", "causal", 0, 1, "first_token", 0.6)])
    heads.loc[0, "chance"] = 0.6  # a causal model's early queries: uniform attention is half on the first token
    assert atlas.head_roles(heads)["roles"].tolist() == [[], ["sink"]]


def test_role_rules_state_every_threshold():
    rules = atlas.role_rules()
    assert ("previous-token: `prev_token` \u2265 0.5 beyond chance; puts at least half of its attention on the "
            "previous token." in rules)
    assert any(r.startswith("positional: `positional_prev` or `positional_next` \u2265 0.9 beyond chance;")
               and "Voita" in r for r in rules)
    assert [r.split(":")[0] for r in rules[:-1]] == [role.name for role in atlas.ROLES]


def test_ranks_run_from_the_striking_end():
    heads = heads_frame([("m", "causal", 0, h, "entropy", v) for h, v in enumerate([2.0, 0.5, 1.0])]
                        + [("m", "causal", 0, h, "prev_token", v) for h, v in enumerate([0.2, 0.9, 0.2])]
                        + [("m", "causal", 0, h, "next_token", 0.0) for h in range(3)])
    ranks = atlas.head_ranks(heads).set_index(["metric", "head"])["rank"]
    assert ranks["entropy"].tolist() == [3.0, 1.0, 2.0]  # low entropy is striking
    assert ranks["prev_token"].tolist() == [2.0, 1.0, 3.0]  # ties go to the lower head
    assert ranks["next_token"].isna().all()  # every head the same: no rank


# --- the data the page embeds -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ewt():
    return compare_runs([load(EWT_RUN)])


def test_the_committed_ewt_atlas_maps_every_head_of_both_models_as_head_map_does(ewt):
    """The committed run was swept with --similarity-sample 64: each model's map has a point per head, at
    `head_map`'s coordinates (rounded to 3 significant digits)."""
    from headscan.analysis.families import head_map

    data = atlas.atlas_data(ewt)
    for model, heads in (("minilm", 72), ("smollm2", 270)):
        shown = next(m for m in data["models"] if m["name"] == model)
        n_heads = shown["heads"]
        mapped = head_map(ewt["similarity"], model)
        assert len(mapped) == heads and sum(x is not None for x in shown["map"]["x"]) == heads
        at = (mapped["layer"] * n_heads + mapped["head"]).to_numpy(int)
        np.testing.assert_allclose([shown["map"]["x"][i] for i in at], mapped["x"], rtol=5e-3, atol=1e-9)
        np.testing.assert_allclose([shown["map"]["y"][i] for i in at], mapped["y"], rtol=5e-3, atol=1e-9)


def test_atlas_data_holds_every_head_as_in_heads_parquet(ewt):
    data = atlas.atlas_data(ewt)
    minilm = next(m for m in data["models"] if m["name"] == "minilm")
    assert (minilm["layers"], minilm["heads"], minilm["family"]) == (6, 12, "bidirectional")
    heads = load(EWT_RUN).heads
    row = heads[(heads.model == "minilm") & (heads.label == "L0H2") & (heads.metric == "prev_token")].iloc[0]
    scores = minilm["metrics"]["prev_token"]
    assert scores["value"][2] == pytest.approx(row.value, rel=1e-4)
    assert scores["low"][2] == pytest.approx(row.ci_low, rel=1e-4) and scores["rank"][2] == 1
    assert "previous-token" in minilm["roles"][2]
    # a run with importance.parquet colours by each head's effect too (atlas.IMPORTANCE), after the metrics
    assert [m["name"] for m in data["metrics"]] == ewt.metrics + [atlas.IMPORTANCE] * ("importance" in ewt.frames)
    smollm2 = next(m for m in data["models"] if m["name"] == "smollm2")
    assert smollm2["metrics"]["next_token"]["why"].startswith("a causal model's queries cannot see later tokens")
    assert smollm2["metrics"]["sep"]["value"] == [None] * 270  # NaN is null in the JSON
    assert len(smollm2["offsets"]["value"]) == 270 and smollm2["offsets"]["d"] == list(range(-8, 9))


def test_atlas_data_holds_the_other_tables_rows_column_by_column(ewt):
    """Each row of positions (and the other tables) is there once: its head, its key cells, its value."""
    minilm = next(m for m in atlas.atlas_data(ewt)["models"] if m["name"] == "minilm")
    positions = next(t for t in minilm["other"] if t["table"] == "positions")
    table = load(EWT_RUN)["positions"]
    table = table[(table.model == "minilm") & table.value.notna()]
    assert len(positions["at"]) == len(positions["key"]) == len(positions["value"]) == len(table)
    assert len(positions["cells"]) == len({tuple(c) for c in positions["cells"]})  # each combination once
    got = sorted((at, positions["cells"][k][0], v) for at, k, v in zip(positions["at"], positions["key"],
                                                                      positions["value"]))
    want = sorted((int(layer * 12 + head), metric, value) for layer, head, metric, value in
                  zip(table.layer, table["head"], table.metric, table.value))
    assert [g[:2] for g in got] == [w[:2] for w in want]
    np.testing.assert_allclose([g[2] for g in got], [w[2] for w in want], rtol=1e-4)


def test_example_patterns_are_embedded_as_bytes(ewt):
    patterns = np.zeros((6, 12, 3, 3), dtype=np.float32)
    patterns[0, 2] = np.eye(3)[[0, 0, 1]]  # each query on the token before it (the first on itself)
    examples = Examples("a b c", "chosen", every_head=(HeadPatterns("minilm", "a b c", ("a", "b", "c"), patterns),))
    minilm = next(m for m in atlas.atlas_data(ewt, examples)["models"] if m["name"] == "minilm")
    [example] = minilm["examples"]
    raw = np.frombuffer(base64.b64decode(example["bytes"]), dtype=np.uint8).reshape(6, 12, 3, 3)
    np.testing.assert_array_equal(raw[0, 2] / 255, patterns[0, 2])
    assert example["tokens"] == ["a", "b", "c"] and example["title"] == "the example sentence"


def test_each_heads_corpus_examples_are_embedded_as_examples_parquet_keeps_them(ewt):
    """Per head and metric, every kept unit of examples.parquet in rank order, top first: its text (written once
    per model), its value (4 significant digits) and its count; a unit kept by many heads is one text."""
    minilm = next(m for m in atlas.atlas_data(ewt)["models"] if m["name"] == "minilm")
    shown = minilm["corpus_examples"]
    table = load(EWT_RUN)["examples"]
    table = table[table.model == "minilm"]
    assert len(shown["texts"]) == table["text"].nunique() == len(set(shown["texts"]))
    for metric, layer, head in (("prev_token", 0, 2), ("entropy", 3, 7), ("first_token", 5, 11)):
        rows = table[(table.metric == metric) & (table.layer == layer) & (table["head"] == head)]
        rows = rows.sort_values(["end", "rank"], ascending=[False, True])  # "top" before "bottom"
        kept = shown["metrics"][metric][layer * 12 + head]
        assert [(e, r) for e, r, *_ in kept] == [(int(e == "bottom"), int(r)) for e, r in zip(rows.end, rows["rank"])]
        assert [shown["texts"][t] for _, _, t, _, _ in kept] == list(rows.text)
        np.testing.assert_allclose([v for *_, v, _ in kept], rows.value, rtol=5e-4)
        assert [c for *_, c in kept] == list(rows["count"])
    assert sum(len(h) for per_metric in shown["metrics"].values() for h in per_metric) == len(table)


def test_atlas_html_is_self_contained_and_cannot_be_closed_early(ewt):
    page = atlas.atlas_html(ewt)
    data = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', page, re.S).group(1)
    # the corpus's own text may hold addresses (EWT's web text does): data the page shows, nothing it loads
    assert "http://" not in page.replace(data, "") and "https://" not in page.replace(data, "")
    assert "</" not in data
    assert json.loads(data)["initial"] == "prev_token"
    # every metric and role to colour by (and head family where the run has similarity.parquet); then the
    # scale: value, lift over chance, value / chance
    families = "similarity" in ewt.frames and len(ewt["similarity"]) > 0
    controls = page.split("<script")[0]  # the page's own controls, not the options its script writes
    effects = "importance" in ewt.frames  # each head's effect, where the run ablated heads
    assert controls.count("<option") == len(ewt.metrics) + effects + 1 + families + 3
    assert ('value="@cluster"' in page) == families


# --- in a real browser --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def atlas_page(ewt, tmp_path_factory):
    """The report's page over the committed EWT run, with the atlas first; the static sections are not needed."""
    document = Document("atlas", [Heading(1, "atlas"), Raw(atlas.atlas_html(ewt))])
    path = tmp_path_factory.mktemp("atlas") / "index.html"
    path.write_text(to_html(document), encoding="utf-8")
    return path


@pytest.mark.browser
def test_atlas_works_in_headless_chromium(atlas_page, tmp_path):
    sync_playwright = playwright_or_skip()
    heads = load(EWT_RUN).heads
    expected = heads[(heads.model == "minilm") & (heads.label == "L0H2") & (heads.metric == "prev_token")].value.iloc[0]
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=shutil.which("chromium"), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900})
        try:
            page = browser.new_page()
            errors, requests = [], []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(atlas_page.as_uri())
            page.wait_for_selector("#atlas.ready", timeout=20_000)

            cell = page.locator('rect.atlas-cell[data-model="minilm"][data-label="L0H5"]')
            before = cell.get_attribute("fill")
            page.select_option("#atlas-metric", "entropy")
            after = cell.get_attribute("fill")
            assert before != after  # the grid is recoloured by the chosen metric
            assert "nats" in page.inner_text("#atlas-legend")
            page.select_option("#atlas-metric", "@role")
            assert cell.get_attribute("fill") != after
            page.select_option("#atlas-metric", "prev_token")
            page.select_option("#atlas-scale", "lift")  # value - chance, white at chance
            assert "at chance" in page.inner_text("#atlas-legend") and cell.get_attribute("fill") != before
            page.select_option("#atlas-scale", "value")
            assert cell.get_attribute("fill") == before

            page.locator('rect.atlas-cell[data-model="minilm"][data-label="L0H2"]').click()
            panel = page.locator("#atlas-panel")
            assert panel.is_visible() and "minilm L0H2" in panel.locator("h3").inner_text()
            value = panel.locator('tr[data-metric="prev_token"] td.value')
            assert float(value.get_attribute("data-value")) == pytest.approx(expected, rel=1e-4)
            assert float(value.inner_text().split()[0]) == pytest.approx(expected, abs=5e-4)
            assert "previous-token" in panel.inner_text() and panel.locator("svg.atlas-offsets").count() == 1
            chance = heads[(heads.model == "minilm") & (heads.label == "L0H2") & (heads.metric == "prev_token")]
            shown = panel.locator('tr[data-metric="prev_token"] td.chance').inner_text()
            assert float(shown) == pytest.approx(chance["chance"].iloc[0], abs=5e-4)
            assert "positions" in panel.locator("h4").all_inner_texts()  # the other tables' rows of this head
            # folded under its name (15 rows); a click opens it
            panel.locator("details.atlas-more summary", has_text="positions").click()
            positions = load(EWT_RUN)["positions"]
            first = positions[(positions.model == "minilm") & (positions.layer == 0) & (positions["head"] == 2) &
                              (positions.metric == "first_token_by_position") & positions.value.notna()].iloc[0]
            assert f"{first.value:.3f}" in panel.inner_text()

            page.fill("#atlas-search", "L18H6")
            assert "L18H6 in smollm2" in page.inner_text("#atlas-found")
            # smollm2's cell and its controls' (random-init copies, shuffled words: the same architecture)
            assert page.locator("rect.atlas-cell.found").count() == heads[heads.label == "L18H6"].model.nunique() == 7
            page.press("#atlas-search", "Enter")
            assert "smollm2 L18H6" in panel.locator("h3").inner_text()
            page.fill("#atlas-search", "L40H1")
            assert page.inner_text("#atlas-found") == "no L40H1 in any model"
        finally:
            browser.close()
    assert errors == []
    assert [url for url in requests if not url.startswith(("file://", "data:"))] == []


@pytest.mark.browser
def test_the_panel_shows_the_heads_corpus_examples_and_the_scatter_opens_heads(atlas_page, tmp_path):
    """In headless Chromium: a head's panel lists its top and bottom units of the corpus for the metric colouring
    the grids (values and texts as examples.parquet has them); the scatter draws every head of each model with
    both quantities, placed by value, and a point opens its head."""
    from conftest import chromium_page

    run = load(EWT_RUN)
    examples, heads = run["examples"], run.heads
    mine = examples[(examples.model == "minilm") & (examples.layer == 0) & (examples["head"] == 2)]
    with chromium_page(atlas_page, tmp_path / "profile") as (page, errors):
        page.locator('rect.atlas-cell[data-model="minilm"][data-label="L0H2"]').click()
        panel = page.locator("#atlas-panel")
        assert panel.locator("h4.atlas-units-title").inner_text() == "Where it does this most and least: prev_token"
        rows = panel.locator("table.atlas-units tbody tr")
        want = mine[mine.metric == "prev_token"].sort_values(["end", "rank"], ascending=[False, True])
        assert rows.count() == len(want) == 10
        first = rows.nth(0).locator("td")
        assert first.nth(0).inner_text() == "top 1"
        assert float(first.nth(1).inner_text()) == pytest.approx(want.value.iloc[0], abs=5e-4)
        assert first.nth(2).inner_text() == str(want["count"].iloc[0])
        assert first.nth(3).get_attribute("title") == want.text.iloc[0]
        assert rows.nth(9).locator("td").nth(0).inner_text() == "bottom 5"
        assert "not the head's attention on it" in panel.inner_text()
        page.select_option("#atlas-metric", "entropy")  # the panel follows the grids' metric
        assert panel.locator("h4.atlas-units-title").inner_text().endswith(": entropy")
        page.select_option("#atlas-metric", "@role")  # no examples of a role: the metric the head ranks best on
        assert "a metric without examples" in panel.inner_text()

        plots = page.locator("#atlas-scatter .atlas-scatter-plot")
        names = list(dict.fromkeys(heads.model))  # one plot per swept model, controls included, in the run's order
        assert plots.count() == len(names) == 14
        smollm2 = names.index("smollm2")
        page.select_option('#atlas-scatter select[data-axis="x"]', "prev_token")
        page.select_option('#atlas-scatter select[data-axis="y"]', "positional_prev")
        for model, n_heads in (("minilm", 72), ("smollm2", 270)):
            k = names.index(model)
            wide = heads[heads.model == model].pivot(index="label", columns="metric", values="value")
            both = wide[["prev_token", "positional_prev"]].dropna()
            points = plots.nth(k).locator("circle.atlas-scatter-point")
            assert points.count() == len(both) == n_heads
            cx = {points.nth(i).get_attribute("data-label"): float(points.nth(i).get_attribute("cx"))
                  for i in range(points.count())}
            assert max(cx, key=cx.get) == both["prev_token"].idxmax()  # placed by value: the rightmost is the top head
            assert min(cx, key=cx.get) == both["prev_token"].idxmin()
        point = plots.nth(smollm2).locator('circle.atlas-scatter-point[data-label="L18H6"]')
        before = point.get_attribute("fill")
        page.select_option('#atlas-scatter select[data-axis="colour"]', "lift:induction")
        assert plots.nth(smollm2).locator('circle.atlas-scatter-point[data-label="L18H6"]').get_attribute("fill") != before
        # heads overlap where their values are close: a click event on the point itself, not at its pixel
        plots.nth(smollm2).locator('circle.atlas-scatter-point[data-label="L18H6"]').dispatch_event("click")
        assert "smollm2 L18H6" in panel.locator("h3").inner_text()
        page.screenshot(path=str(tmp_path / "atlas.png"), full_page=True)
    assert errors == []


@pytest.mark.browser
@pytest.mark.parametrize("with_atlas", [True, False], ids=["with the atlas", "without"])
def test_tables_sort_by_a_click_with_the_page_script_once(ewt, with_atlas, tmp_path):
    """The page's one script (headscan/data/atlas.js) sorts tables: held by the atlas where there is one, else
    added at the end of the page; either way each table is wired once, so one click sorts ascending."""
    from headscan.report.document import Table, page_script

    frame = pd.DataFrame({"head": ["L0H1", "L0H2", "L1H0", "L1H1"], "value": ["0.5", "–", "0.25", "10"]})
    blocks = [Heading(1, "page"), *([Raw(atlas.atlas_html(ewt))] if with_atlas else []),
              Table(frame, numeric=("value",), sortable=True)]
    page_file = tmp_path / "index.html"
    page_file.write_text(to_html(Document("page", blocks)), encoding="utf-8")
    assert page_file.read_text(encoding="utf-8").count(page_script()) == 1
    sync_playwright = playwright_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=shutil.which("chromium"), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900})
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_file.as_uri())
            if with_atlas:
                page.wait_for_selector("#atlas.ready", timeout=20_000)
            heading = page.locator("table.sortable th.num")
            heads = page.locator("table.sortable tbody td:first-child")
            heading.click()  # numbers as numbers, "–" last
            assert heading.get_attribute("aria-sort") == "ascending"
            assert heads.all_inner_texts() == ["L1H0", "L0H1", "L1H1", "L0H2"]
            heading.click()
            assert heads.all_inner_texts() == ["L1H1", "L0H1", "L1H0", "L0H2"]
        finally:
            browser.close()
    assert errors == []


@pytest.mark.browser
@pytest.mark.parametrize("model, label", [("minilm", "L0H2"), ("smollm2", "L16H0")])
def test_a_heads_panel_over_the_ewt_run_fits_one_screen_and_keeps_every_syntax_row(atlas_page, tmp_path, model,
                                                                                    label):
    """The committed EWT run's panel was about 5,300 px at 1,400 px wide, most of it a syntax table of 80-odd rows;
    folded, it fits 1,600 px (tests/test_report_layout.py states why), and the fold holds every row of the head's
    syntax.parquet that the section shows. The re-swept run's new scores (output_norm, sink_ratio, attended_logit,
    importance) took it to 1,680-1,743 px; the panel now folds its less-read tables side by side and its notes on
    reading the scores (about 1,370 and 1,450 px)."""
    from conftest import chromium_page

    from headscan.analysis.syntax import relation_order

    syntax = load(EWT_RUN)["syntax"]
    shown = syntax[syntax["relation"].isin(relation_order(syntax)) & syntax["value"].notna()]
    layer, head = (int(x) for x in label[1:].split("H"))
    mine = shown[(shown.model == model) & (shown.layer == layer) & (shown["head"] == head)]
    with chromium_page(atlas_page, tmp_path / "profile") as (page, errors):
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.locator(f'rect.atlas-cell[data-model="{model}"][data-label="{label}"]').click()
        panel = page.locator("#atlas-panel")
        assert panel.bounding_box()["height"] <= 1600
        heading = panel.locator("h4.atlas-other", has_text="syntax")
        fold = heading.locator("xpath=following-sibling::details[1]")
        preview = heading.locator("xpath=following-sibling::table[1]").locator("tbody tr").count()
        # every row, many more than those shown first (minilm, bidirectional, has no _visible rows: 42 here)
        assert fold.locator("tbody tr").count() == len(mine) > 4 * preview == 20
    assert errors == []
