"""Reports: the numbers they pick (plain functions over tables) and the folder `write_report` writes."""

import io
import shutil
import subprocess
import types

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

import headscan.models  # noqa: E402, F401
import headscan.sweep  # noqa: E402, F401  (imported before any test patches headscan.models.load_model)
from headscan import report, tables  # noqa: E402
from headscan.errors import ConfigError, ModelNotFoundError, TablesError  # noqa: E402
from headscan.metrics import METRICS as REGISTRY  # noqa: E402
from headscan.tables import SweepTables, load, write  # noqa: E402

METRICS = ["prev_token", "next_token", "self", "first_token", "sep", "entropy", "entropy_norm", "distance",
           "positional_prev", "positional_next", "induction", "duplicate_token"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def value(model, family, metric, layer, head):
    """Known values: gpt L0H1 and bert L1H2 are previous-token heads, bert L0H3 a next-token head."""
    if metric == "prev_token":
        return {(0, 1): 0.999, (1, 2): 0.8}.get((layer, head), 0.1 + 0.05 * head)
    if metric in ("next_token", "positional_next"):
        return 0.0 if family == "causal" else (0.9 if (layer, head) == (0, 3) else 0.05 * head)
    if metric == "sep":
        return np.nan if family == "causal" else 0.2 + 0.1 * layer
    if metric == "entropy":
        return 0.5 + layer + 0.25 * head
    if metric == "distance":
        return 1.0 + 2 * head
    return ((layer * 5 + head * 3 + len(metric)) % 10) / 10


def make_tables(models, *, shift=0.0):
    heads, offsets, infos = [], [], []
    for model, family, n_layers, n_heads in models:
        for layer in range(n_layers):
            for head in range(n_heads):
                common = dict(model=model, family=family, layer=layer, head=head, label=f"L{layer}H{head}",
                              kv_group=head)
                for metric in METRICS:
                    v = value(model, family, metric, layer, head)
                    if metric == "self":
                        v = min(1.0, v + shift)
                    width = 0.4 if (metric, layer, head) == ("prev_token", 1, 0) else 0.02
                    heads.append(dict(common, metric=metric, value=v, sum=v * 10, count=10.0,
                                      ci_low=v - width / 2, ci_high=v + width / 2))
                for offset in range(-8, 9):
                    v = 0.5 ** abs(offset + 1 - head)
                    offsets.append(dict(common, offset=offset, value=v, sum=v, count=1.0, ci_low=v, ci_high=v))
        infos.append({"name": model, "source": "alias", "id": f"/weights/{model}", "revision": "sha256:" + "0f" * 32,
                      "family": family, "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": 1, "d_model": 48,
                      "n_params": 1234567, "tokenizer": f"{model.upper()}Tokenizer", "vocab_size": 999,
                      "max_context": 64, "n_segments": 4, "n_tokens": 321, "seconds": 0.5})
    provenance = {
        "headscan_version": "0.1.0", "command": "headscan sweep --model gpt --model bert",
        "started": "2026-01-02T03:04:05Z", "finished": "2026-01-02T03:05:06Z",
        "corpus": {"source": "builtin", "kind": "text", "sha256": "ab" * 32, "n_segments": 4},
        "config": {"max_len": 128, "bootstrap": 200, "seed": 0},
        "versions": {"python": "3.11.7", "torch": "2.5.0"}, "models": infos,
    }
    return SweepTables(pd.DataFrame(heads), pd.DataFrame(offsets), provenance)


GPT = ("gpt", "causal", 2, 3)
BERT = ("bert", "bidirectional", 2, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return write(make_tables([GPT, BERT]), root / "runA"), write(make_tables([GPT], shift=0.05), root / "runB")


@pytest.fixture(scope="module")
def one_report(runs, tmp_path_factory):
    return report.write_report([runs[0]], tmp_path_factory.mktemp("r") / "one", load_models=False)


@pytest.fixture(scope="module")
def two_reports(runs, tmp_path_factory):
    return report.write_report(list(runs), tmp_path_factory.mktemp("r") / "two", top=3, load_models=False)


# --- the numbers ------------------------------------------------------------------------------------------


def test_top_heads_are_ranked_per_model_with_intervals(runs):
    heads = load(runs[0]).heads
    top = report.top_heads(heads, metric="prev_token", n=2)
    assert top[["model", "rank", "label"]].values.tolist() == [
        ["gpt", 1, "L0H1"], ["gpt", 2, "L1H2"], ["bert", 1, "L0H1"], ["bert", 2, "L1H2"]]
    np.testing.assert_allclose(top["value"], [0.999, 0.8, 0.999, 0.8])
    np.testing.assert_allclose(top["ci_low"], [0.989, 0.79, 0.989, 0.79])
    assert not top["wide"].any()
    wide = report.top_heads(heads, metric="prev_token", n=6, model="gpt")
    assert wide.set_index("label")["wide"].to_dict()["L1H0"] and wide["wide"].sum() == 1


def test_top_heads_rank_as_the_tables_do(runs):
    heads = load(runs[0]).heads
    for metric in ("prev_token", "self", "entropy"):
        ours = report.top_heads(heads, metric=metric, n=4)
        theirs = tables.top_heads(heads, metric, 4)
        for model in ("gpt", "bert"):
            assert (ours[ours.model == model]["label"].tolist()
                    == theirs[theirs.model == model]["label"].tolist()), (metric, model)


def test_top_heads_skip_undefined_and_constant_metrics(runs):
    heads = load(runs[0]).heads
    assert report.top_heads(heads, metric="sep")["model"].unique().tolist() == ["bert"]
    assert report.top_heads(heads, metric="next_token")["model"].unique().tolist() == ["bert"]


def test_ci_is_wide_is_absolute_for_shares_and_relative_otherwise():
    rows = pd.DataFrame({"metric": ["self", "self", "distance", "distance"], "value": [0.5, 0.5, 10.0, 1.0],
                         "ci_low": [0.4, 0.46, 9.5, 0.5], "ci_high": [0.65, 0.54, 10.5, 1.5]})
    assert report.ci_is_wide(rows).tolist() == [True, False, False, True]


def test_findings_state_the_numbers(runs):
    sentences = report.findings(load(runs[0]).heads)
    assert "In gpt, L0H1 puts 99.9% of its attention on the previous token." in sentences
    assert "In bert, L0H3 puts 90.0% of its attention on the next token." in sentences
    assert ("gpt's `next_token` is 0 for every head, as a causal model's must be: it cannot attend to later "
            "tokens.") in sentences
    assert "gpt's `sep` is undefined for every head: no query of the corpus counts for it." in sentences
    assert "In gpt, attention is most focused in layer 0 (mean entropy 0.75 nats) and broadest in layer 1 (1.75 nats)." in sentences
    assert "2 of 6 heads in gpt put more than half of their attention on the previous token." in sentences
    # A causal model never gets "as a causal model must" for a metric that is merely 0, and bert never does.
    assert not any(s.startswith("bert's `next_token`") for s in sentences)


def test_findings_flag_a_causal_model_that_looks_ahead():
    heads = make_tables([GPT]).heads
    heads.loc[(heads.metric == "next_token") & (heads.label == "L1H1"), "value"] = 0.3
    assert any(s.startswith("Check the sweep: gpt is causal, yet L1H1 scores 0.3 on `next_token`")
               for s in report.findings(heads))


def test_merge_runs_tells_the_same_model_apart(runs):
    comparison = report.merge_runs([load(r) for r in runs], ["runA", "runB"])
    assert [m.name for m in comparison.models] == ["runA:gpt", "bert", "runB:gpt"]
    assert list(dict.fromkeys(comparison.heads["model"])) == ["runA:gpt", "bert", "runB:gpt"]
    assert comparison.models[2].info["tokenizer"] == "GPTTokenizer"
    assert any(s.startswith("runA:gpt and runB:gpt agree within 0.050 on every share score")
               for s in report.findings(comparison.heads))


def test_run_names_are_folder_names_made_distinct():
    assert report.run_names(["x/out", "y/out", "z/gpt2", "w/out"]) == ["out", "out-2", "gpt2", "out-3"]


def test_looking_both_ways_picks_prev_for_causal_and_next_for_bidirectional(runs):
    picks = report.looking_both_ways_heads(load(runs[0]).heads)
    assert picks[["model", "metric", "label", "layer", "head"]].values.tolist() == [
        ["gpt", "prev_token", "L0H1", 0, 1], ["bert", "next_token", "L0H3", 0, 3]]


def test_model_shapes_come_from_provenance(runs):
    comparison = report.merge_runs([load(r) for r in runs], ["runA", "runB"])
    shapes = report.model_shapes(comparison)
    assert shapes.columns.tolist() == ["run", "model", "family", "layers", "heads", "kv heads", "width",
                                       "parameters", "tokenizer", "vocabulary", "context"]
    assert shapes.iloc[1].tolist() == ["runA", "bert", "bidirectional", "2", "4", "1", "48", "1,234,567",
                                       "BERTTokenizer", "999", "64"]


# --- the report folder ------------------------------------------------------------------------------------


def expected_figures(models):
    names = {f"heatmap_{metric}_{model}.png" for metric in METRICS for model in models}
    names |= {f"offsets_{model}.png" for model in models} | {"prev_next_scatter.png", "entropy_by_layer.png"}
    return names


def test_report_writes_html_markdown_and_every_figure_as_png(one_report):
    assert sorted(p.name for p in one_report.iterdir()) == ["figures", "index.html", "report.md"]
    files = {p.name: p for p in (one_report / "figures").iterdir()}
    assert set(files) == expected_figures(["gpt", "bert"])
    for path in files.values():
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 1000
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
        with Image.open(io.BytesIO(data)) as image:
            assert image.size[0] > 100 and image.size[1] > 100
            assert "Software" not in image.info  # no tool stamp (nor date) in the file
    md = (one_report / "report.md").read_text()
    for name in files:
        assert f"](figures/{name})" in md


def test_html_is_self_contained(one_report):
    page = (one_report / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert page.count('src="data:image/png;base64,') == len(expected_figures(["gpt", "bert"]))
    assert '<nav class="toc">' in page and 'href="#top-heads"' in page and 'id="top-heads"' in page


def test_report_content(one_report):
    page, md = (one_report / "index.html").read_text(), (one_report / "report.md").read_text()
    for metric in METRICS:  # each definition, word for word from the registry
        first = report._paragraphs(REGISTRY[metric].definition)[0]
        assert isinstance(first, str)
        assert report._inline_html(first) in page and report._inline_md(first) in md
    for text in (page, md):
        assert "L2H0" in text and "0-indexed" in text  # the labelling note
        assert "2026-01-02T03:04:05Z" in text and "sha256:0f0f0f0f0f0f0f0f" in text and "torch 2.5.0" in text
        assert "1,234,567" in text and "GPTTokenizer" in text
        assert "L0H1 puts 99.9% of its attention on the previous token" in text
        assert "L0H1  0.999 [0.989, 1.009]" in text  # a top head with its 95% interval
        assert "L1H0  0.100 [-0.100, 0.300] †" in text  # a wide interval is marked
        assert "could not be drawn" in text and "without loading the models" in text


def test_markdown_tables_and_headings(one_report):
    md = (one_report / "report.md").read_text()
    assert md.startswith("# headscan report: runA\n")
    assert "| rank | gpt | bert |" in md and "**Contents**" in md and "1. [Findings](#findings)" in md


def test_report_over_two_runs_compares_them(two_reports):
    page = (two_reports / "index.html").read_text()
    assert "runA:gpt" in page and "runB:gpt" in page and "headscan report: runA vs runB" in page
    assert "agree within 0.050" in page
    assert "<th>runA:gpt</th><th>bert</th><th>runB:gpt</th>" in page  # top heads side by side
    names = {p.name for p in (two_reports / "figures").iterdir()}
    assert names == expected_figures(["runA-gpt", "bert", "runB-gpt"])


def test_regenerating_gives_identical_bytes(runs, two_reports, tmp_path):
    again = report.write_report(list(runs), tmp_path / "again", top=3, load_models=False)
    assert (again / "index.html").read_bytes() == (two_reports / "index.html").read_bytes()
    assert (again / "report.md").read_bytes() == (two_reports / "report.md").read_bytes()
    for path in (two_reports / "figures").iterdir():
        assert (again / "figures" / path.name).read_bytes() == path.read_bytes()


def test_unavailable_model_is_explained_and_the_rest_still_rendered(runs, tmp_path, monkeypatch):
    def missing(spec, **kwargs):
        raise ModelNotFoundError(f"model {spec!r} not found; install it")

    monkeypatch.setattr(headscan.models, "load_model", missing)
    out = report.write_report([runs[0]], tmp_path / "r")
    page = (out / "index.html").read_text()
    assert "could not be drawn for 2 of 2 models" in page
    assert "ModelNotFoundError: model &#x27;gpt&#x27; not found; install it" in page
    assert {p.name for p in (out / "figures").iterdir()} == expected_figures(["gpt", "bert"])


def test_example_attention_is_drawn_when_the_models_load(runs, tmp_path, monkeypatch):
    calls = []

    def fake_load(spec, **kwargs):
        return types.SimpleNamespace(name=spec, family="x", n_layers=2, n_heads=4)

    def fake_example(model, text, layer):
        calls.append((model.name, text, layer))
        tokens = text.split()
        n = len(tokens)
        pattern = np.tile(np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None], (4, 1, 1))  # (head, q, k)
        return tokens, pattern

    monkeypatch.setattr(headscan.models, "load_model", fake_load)
    monkeypatch.setattr(headscan.sweep, "example_attention", fake_example)
    out = report.write_report([runs[0]], tmp_path / "r", example="one two three")
    assert calls == [("gpt", "one two three", 0), ("bert", "one two three", 0)]
    assert (out / "figures" / "looking_both_ways.png").read_bytes().startswith(PNG)
    page = (out / "index.html").read_text()
    assert "could not be drawn" not in page and "gpt L0H1 (prev_token 0.999" in page


def test_a_failed_report_leaves_the_old_one_whole(runs, tmp_path, monkeypatch):
    out = report.write_report([runs[0]], tmp_path / "r", load_models=False)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def broken(*args, **kwargs):
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(report.figures, "entropy_by_layer", broken)
    with pytest.raises(RuntimeError, match="drawing failed"):
        report.write_report([runs[0]], out, load_models=False)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary folders left behind


def test_report_refuses_to_replace_a_folder_that_is_not_a_report(runs, tmp_path):
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "main.py").write_text("precious")
    with pytest.raises(ConfigError, match=r"holds \['main.py'\].*choose another --out"):
        report.write_report([runs[0]], tmp_path / "project", load_models=False)
    assert (tmp_path / "project" / "main.py").read_text() == "precious"


def test_default_folder_is_named_after_the_runs(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = report.write_report(list(runs), load_models=False, top=1)
    assert out == tmp_path.joinpath("reports", "runA-runB").relative_to(tmp_path)
    assert (tmp_path / out / "index.html").is_file()


def test_errors_name_the_problem(runs, tmp_path):
    with pytest.raises(ConfigError, match="at least one sweep output folder"):
        report.write_report([])
    with pytest.raises(TablesError, match="no such folder"):
        report.write_report([tmp_path / "missing"])
    with pytest.raises(ConfigError, match=r"^--top must be at least 1, not 0; pass how many heads .*--top 10$"):
        report.write_report([runs[0]], tmp_path / "r", top=0, load_models=False)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"file: exists and is not a folder; choose another --out"):
        report.write_report([runs[0]], tmp_path / "file", load_models=False)


def test_a_metric_this_headscan_does_not_know_is_drawn_but_not_ranked(tmp_path):
    run = make_tables([GPT])
    run.heads.loc[run.heads.metric == "induction", "metric"] = "retired_metric"
    out = report.write_report([write(run, tmp_path / "old")], tmp_path / "r", load_models=False)
    md = (out / "report.md").read_text()
    assert (out / "figures" / "heatmap_retired_metric_gpt.png").is_file() and "### Top prev_token" in md
    assert "### Top retired_metric" not in md
    assert "not registered in the installed headscan, so it is drawn but not ranked" in md


def test_report_on_a_real_sweep_of_tiny_checkpoints(tiny_gpt2, tiny_bert, tmp_path):
    from headscan.sweep import SweepConfig, sweep

    sweep([str(tiny_gpt2), str(tiny_bert)], "builtin", tmp_path / "run", SweepConfig(device="cpu", limit=3, bootstrap=0))
    out = report.write_report([tmp_path / "run"], tmp_path / "report", top=3)
    page = (out / "index.html").read_text()
    assert (out / "figures" / "looking_both_ways.png").is_file(), page[page.find("Looking both ways"):][:2000]
    assert "could not be drawn" not in page


@pytest.mark.browser
def test_index_html_renders_in_a_headless_browser(two_reports, tmp_path):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); it renders index.html headless")
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1280,2000",
         (two_reports / "index.html").resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    with Image.open(shot) as image:
        assert image.size == (1280, 2000)
        colours = image.convert("RGB").getcolors(maxcolors=1_000_000)
    assert colours is not None and len(colours) > 50  # text, tables, figures: not a blank page
    white = max(colours)[0] / (1280 * 2000)
    assert white < 0.95
