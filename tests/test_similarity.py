"""Head families: similarity.parquet against a plain double loop of Clark et al.'s Jensen-Shannon divergence
over Hugging Face's own attention, its symmetry and zero diagonal, shards and chunked attention, planted heads
sharing a cluster, classical MDS against a hand computation, the pattern types, the figure and the report section.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer, GPT2LMHeadModel

import headscan
from headscan.analysis import families
from headscan.analysis.runs import compare_runs
from headscan.errors import ConfigError, TablesError
from headscan.metrics.similarity import js_sums
from headscan.plots.families import head_map as draw_head_map
from headscan.report.atlas import NEAREST, atlas_data, atlas_html
from headscan.report.document import Document, Figures, Heading, Raw, Table, to_html
from headscan.report.figures import Pngs
from headscan.report.sections.families import families_section
from headscan.scan import merge
from headscan.scan.similarity import sample_of
from headscan.testing import build_planted_checkpoint

TEXTS = ["The cat sat on the mat.", "It was tired, so it slept all day long.", "Dogs bark.",
         "A very small model reads these sentences one after another.", "Heads attend.", "Why not?"]

RUNS = Path(__file__).resolve().parents[1] / "reports" / "runs"


def _plain_js(p: list[float], q: list[float]) -> float:
    """Clark et al.'s smoothed JS divergence of two attention rows over the same visible keys, in nats."""
    n = len(p)
    p = [0.999 * x + 0.001 / n for x in p]
    q = [0.999 * x + 0.001 / n for x in q]
    total = 0.0
    for a, b in zip(p, q):
        m = (a + b) / 2
        total += 0.5 * a * math.log(a / m) + 0.5 * b * math.log(b / m)
    return total


def _plain_table(attentions: list[np.ndarray], causal: bool) -> tuple[np.ndarray, int]:
    """The summed divergence of every pair of heads over every query of every sequence (a double loop over
    heads, a loop over queries), and the number of queries; `attentions` are (layer * head, n, n) arrays."""
    size = attentions[0].shape[0]
    sums = np.zeros((size, size))
    queries = 0
    for a in attentions:
        n = a.shape[-1]
        queries += n
        for i in range(size):
            for j in range(size):
                for q in range(n):
                    keys = range(q + 1) if causal else range(n)
                    sums[i, j] += _plain_js([float(a[i, q, k]) for k in keys], [float(a[j, q, k]) for k in keys])
    return sums, queries


def _hf_attentions(folder, texts, causal: bool) -> list[np.ndarray]:
    """Each text's attention of every layer from Hugging Face's own eager model, float64, (layer * head, n, n)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    auto = AutoModelForCausalLM if causal else AutoModelForMaskedLM
    model = auto.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64).eval()
    out = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=not causal)["input_ids"]
        ids = [tokenizer.bos_token_id] + ids if causal else ids
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
        out.append(torch.cat([a[0] for a in attentions]).numpy())
    return out


def _square(table: pd.DataFrame) -> np.ndarray:
    return families.divergences(table, table["model"].iloc[0])[1]


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_similarity_equals_a_plain_double_loop_over_hugging_face_attention(request, arch):
    folder = request.getfixturevalue(f"tiny_{arch}")
    run = headscan.sweep(str(folder), TEXTS, similarity_sample=3, dtype="float64", batch_size=4, bootstrap=0,
                         device="cpu")
    notes = run.provenance.models[0].extra["similarity"]
    assert notes["segments"] == sample_of(len(TEXTS), 3, 0) and notes["sample_n"] == 3
    table = run["similarity"]
    n_heads = run.heads[["layer", "head"]].drop_duplicates().shape[0]
    assert len(table) == n_heads ** 2  # both orders and the diagonal
    sums, queries = _plain_table(_hf_attentions(folder, [TEXTS[i] for i in notes["segments"]], arch == "gpt2"),
                                 causal=arch == "gpt2")
    got = _square(table)
    np.testing.assert_allclose(got, sums / queries, rtol=0, atol=1e-9)
    assert (table["count"] == queries).all()
    assert (np.diag(got) == 0).all() and (got == got.T).all()
    assert (got[~np.eye(len(got), dtype=bool)] > 0).all()  # random heads never attend exactly alike


def test_js_sums_against_the_plain_loop_in_small_blocks():
    rng = np.random.default_rng(0)
    rows = rng.dirichlet(np.ones(5), size=(7, 3))  # (head, query, key)
    entries = torch.from_numpy(rows.reshape(7, 15) * 0.999 + 0.001 / 5)
    want = np.array([[sum(_plain_js(list(rows[i, q]), list(rows[j, q])) for q in range(3)) for j in range(7)]
                     for i in range(7)])
    for block in (8, 8 * 7 * 4, 2**26):  # one entry at a time, a few rows, everything at once
        np.testing.assert_allclose(js_sums(entries, block_bytes=block).numpy(), want, rtol=0, atol=1e-12)


def test_shards_merge_and_chunked_attention_give_the_same_table(tiny_gpt2, tmp_path):
    settings = dict(similarity_sample=4, batch_size=1, bootstrap=0, device="cpu", dtype="float64")
    whole = headscan.sweep(str(tiny_gpt2), TEXTS, **settings)
    parts = [tmp_path / f"part-{k}" for k in range(2)]
    for k, part in enumerate(parts):
        headscan.sweep(str(tiny_gpt2), TEXTS, out=part, shard=f"{k}/2", **settings)
    merged = merge(parts, tmp_path / "merged")
    np.testing.assert_allclose(_square(merged["similarity"]), _square(whole["similarity"]), rtol=0, atol=1e-12)
    assert merged.provenance.models[0].extra["similarity"]["segments"] == sample_of(len(TEXTS), 4, 0)
    chunked = headscan.sweep(str(tiny_gpt2), TEXTS, attention="chunked", query_chunk=3, **settings)
    np.testing.assert_allclose(_square(chunked["similarity"]), _square(whole["similarity"]), rtol=0, atol=1e-9)
    assert "similarity" not in headscan.sweep(str(tiny_gpt2), TEXTS[:2], bootstrap=0, device="cpu").frames


def test_similarity_memory_past_the_budget_is_refused_in_one_line(tiny_gpt2):
    with pytest.raises(ConfigError, match=r"--similarity-sample keeps every layer's attention .* past the attention "
                                          r"budget of 1 MiB; lower --max-len or --batch-size"):
        headscan.sweep(str(tiny_gpt2), TEXTS, similarity_sample=6, max_len=128, batch_size=64, attention_budget=1,
                       bootstrap=0, device="cpu")
    with pytest.raises(ConfigError, match="similarity_sample must be"):
        headscan.SweepConfig(similarity_sample=0)


def _twin_planted(folder) -> str:
    """A planted GPT-2 whose random head L0H3 gets the previous-token head L0H0's queries and keys."""
    path, heads = build_planted_checkpoint(folder, "gpt2", n_layers=2)
    model = GPT2LMHeadModel.from_pretrained(path)
    d = model.config.n_embd // model.config.n_head
    with torch.no_grad():
        attn = model.transformer.h[0].attn.c_attn  # (d_model, 3 d_model): q, k, v columns
        for part in (0, 1):  # queries, keys
            base = part * model.config.n_embd
            attn.weight[:, base + 3 * d: base + 4 * d] = attn.weight[:, base: base + d]
            attn.bias[base + 3 * d: base + 4 * d] = attn.bias[base: base + d]
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """A sweep of `_twin_planted` (its similarity over every text), and its folder."""
    folder = _twin_planted(tmp_path_factory.mktemp("twin") / "twin")
    return folder, headscan.sweep(folder, TEXTS, similarity_sample=6, bootstrap=0, device="cpu")


def test_planted_heads_with_the_same_pattern_share_a_cluster(twins):
    folder, run = twins
    mapped = families.head_map(run["similarity"], folder).set_index("label")
    assert mapped.loc["L0H0", "cluster"] == mapped.loc["L0H3", "cluster"]  # both previous-token
    others = {mapped.loc["L0H1", "cluster"], mapped.loc["L0H2", "cluster"]}  # first token, two back
    assert mapped.loc["L0H0", "cluster"] not in others and len(others) == 2
    types = families.pattern_types(run.heads, run.offsets).set_index(["layer", "head"])["pattern_type"]
    assert types[0, 0] == types[0, 3] == types[0, 2] == "diagonal" and types[0, 1] == "vertical"
    listed = families.clusters(mapped.reset_index(), run["similarity"])
    twins = listed[listed["members"].str.contains("L0H0")]
    assert len(twins) == 1 and "L0H3" in twins["members"].iloc[0] and twins["mean_js"].iloc[0] < 1e-3


def test_the_atlas_colours_by_the_reports_clusters_and_maps_heads_as_head_map(twins):
    folder, run = twins
    comparison = compare_runs([run])
    [model] = atlas_data(comparison)["models"]
    mapped = families.head_map(run["similarity"], folder)
    at = (mapped["layer"] * model["heads"] + mapped["head"]).to_numpy()
    got = model["map"]
    np.testing.assert_allclose(np.array(got["x"])[at], mapped["x"], rtol=5e-3, atol=1e-12)  # 3 digits
    np.testing.assert_allclose(np.array(got["y"])[at], mapped["y"], rtol=5e-3, atol=1e-12)
    cluster = dict(zip(mapped["label"], mapped["cluster"]))
    assert got["cluster"][0] == got["cluster"][3] == cluster["L0H0"] == cluster["L0H3"]  # the twins, by the number
    listed = families.clusters(mapped, run["similarity"])  # ... the section's table gives them
    assert got["order"] == listed["cluster"].tolist()  # largest first
    alone = mapped[mapped["cluster_size"] == 1]
    assert [got["cluster"][i] for i in at[alone.index]] == [None] * len(alone)  # alike no other: no cluster
    assert '<option value="@cluster">head family (cluster)</option>' in atlas_html(comparison)


@pytest.mark.browser
def test_the_atlas_head_map_in_headless_chromium(twins, tmp_path):
    """Under the grid, one point per head, coloured as its cell by any colouring; a point opens its head's panel,
    which names its cluster by the families section's number and its members."""
    from conftest import chromium_page

    folder, run = twins
    mapped = families.head_map(run["similarity"], folder).set_index("label")
    page_file = tmp_path / "index.html"
    page_file.write_text(to_html(Document("atlas", [Raw(atlas_html(compare_runs([run])))])), encoding="utf-8")
    with chromium_page(page_file, tmp_path / "profile") as (page, errors):
        points = page.locator("circle.atlas-point")
        assert points.count() == len(mapped)
        for colouring in ("prev_token", "@cluster", "entropy"):
            page.select_option("#atlas-metric", colouring)
            for label in mapped.index:
                cell = page.locator(f'rect.atlas-cell[data-label="{label}"]').get_attribute("fill")
                assert page.locator(f'circle.atlas-point[data-label="{label}"]').get_attribute("fill") == cell
        page.select_option("#atlas-metric", "@cluster")
        fills = {label: page.locator(f'circle.atlas-point[data-label="{label}"]').get_attribute("fill")
                 for label in mapped.index}
        assert fills["L0H0"] == fills["L0H3"] not in (fills["L0H1"], fills["L0H2"], "#ececec")
        alone = [label for label in mapped.index if mapped.loc[label, "cluster_size"] == 1]
        assert {fills[label] for label in alone} == {"#ececec"}  # light grey: alike no other head
        page.locator('circle.atlas-point[data-label="L0H3"]').hover()
        number = int(mapped.loc["L0H0", "cluster"])
        assert f"cluster {number} (2 heads): L0H0, L0H3" in page.inner_text("#atlas-tip")
        page.locator('circle.atlas-point[data-label="L0H3"]').click()
        panel = page.locator("#atlas-panel")
        assert panel.is_visible() and panel.locator("h3").inner_text().endswith("L0H3")
        assert f"Head family: cluster {number} of" in panel.inner_text() and "2 heads: L0H0, L0H3" in panel.inner_text()
        assert page.locator("circle.atlas-point.open").get_attribute("data-label") == "L0H3"
        # the similarity table has no interval: its panel table has no interval column either (its rows are folded
        # under its name: the headings are read from the page's text, not as rendered)
        similarity = panel.locator("h4", has_text="similarity").first.locator(
            "xpath=ancestor::details[1]//table | following-sibling::table[1]").first
        headers = similarity.locator("th").all_text_contents()
        assert headers[-1] == "value" and "95% interval" not in headers
    assert errors == []


def test_classical_mds_against_a_hand_computation():
    # four corners of a 2 x 1 rectangle: B = -1/2 J D^2 J has eigenvalues 4 and 1 (four points at (+-1, +-1/2)),
    # so the coordinates are the corners centred, axes by eigenvalue, signs fixed by the largest coordinate
    corners = np.array([[0, 0], [2, 0], [2, 1], [0, 1]], dtype=float)
    d = np.linalg.norm(corners[:, None] - corners[None], axis=-1)
    x = families.classical_mds(d)
    assert np.allclose(np.abs(x), [[1, 0.5]] * 4)
    assert np.allclose(np.linalg.norm(x[:, None] - x[None], axis=-1), d)
    assert np.allclose(x, families.classical_mds(d))  # deterministic
    for axis in range(2):
        assert x[np.abs(x[:, axis]).argmax(), axis] > 0
    with pytest.raises(TablesError, match="finite square matrix"):
        families.classical_mds(np.array([[0, np.nan], [np.nan, 0]]))


def test_average_linkage_merges_by_mean_divergence_and_stops_at_the_cut():
    d = np.array([[0, .1, .3, .9], [.1, 0, .2, .9], [.3, .2, 0, .9], [.9, .9, .9, 0]])
    # {0, 1} first (0.1), then {0, 1} with 2 at the mean (0.3 + 0.2) / 2 = 0.25; 3 is 0.9 from all
    assert families.average_linkage(d, cut=0.25).tolist() == [0, 0, 0, 1]
    assert families.average_linkage(d, cut=0.24).tolist() == [0, 0, 1, 2]
    assert families.average_linkage(d, cut=0.0).tolist() == [0, 1, 2, 3]


def _upgma_reference(divergence: np.ndarray, cut: float) -> list[int]:
    """Average linkage by hand: merge the two clusters of smallest mean pairwise divergence (ties: the first pair
    in row-major order) while it is at most `cut`; clusters numbered in the order of their first point."""
    d = (divergence + divergence.T) / 2
    clusters = [[i] for i in range(len(d))]
    while len(clusters) > 1:
        best, pair = np.inf, None
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                mean = sum(d[i, j] for i in clusters[a] for j in clusters[b]) / (len(clusters[a]) * len(clusters[b]))
                if mean < best:
                    best, pair = mean, (a, b)
        if not best <= cut:
            break
        a, b = pair
        clusters[a] = sorted(clusters[a] + clusters.pop(b))
    number = {i: k for k, c in enumerate(sorted(clusters, key=min)) for i in c}
    return [number[i] for i in range(len(d))]


@pytest.mark.parametrize("seed", range(6))
def test_average_linkage_equals_a_plain_upgma_at_every_cut(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    centres = rng.normal(size=(4, 3))
    points = centres[rng.integers(0, 4, n)] + rng.normal(scale=0.4, size=(n, 3))  # a few loose families
    d = np.linalg.norm(points[:, None] - points[None], axis=-1) ** 2 / 10
    d = d + rng.uniform(0, 0.01, d.shape)  # not quite symmetric, as a table's two directions of a pair
    np.fill_diagonal(d, 0.0)
    for cut in (0.0, *np.quantile(d[np.triu_indices(n, 1)], [0.02, 0.1, 0.3, 0.6, 0.9]), 10.0):
        assert families.average_linkage(d, cut).tolist() == _upgma_reference(d, cut), (seed, cut)


def test_average_linkage_keeps_the_committed_families():
    similarity = pd.read_parquet(RUNS / "ewt-dev" / "similarity.parquet")
    for model in similarity["model"].unique():
        _, matrix = families.divergences(similarity, model)
        if len(matrix) <= 80:  # the plain loop is cubic in Python: minilm's 72 heads, not smollm2's 270
            for cut in (0.05, families.CLUSTER_CUT, 0.2):
                assert families.average_linkage(matrix, cut).tolist() == _upgma_reference(matrix, cut), (model, cut)


def test_head_map_figure_and_report_section(tiny_gpt2, tmp_path):
    run = headscan.sweep(str(tiny_gpt2), TEXTS, similarity_sample=3, bootstrap=0, device="cpu", out=tmp_path / "run")
    model = run.models[0]
    mapped = families.head_map(run["similarity"], model).merge(families.pattern_types(run.heads).drop(columns="model"),
                                                                on=["layer", "head"])
    ax = draw_head_map(mapped, model=model, hue="layer")
    assert np.allclose(ax.collections[0].get_offsets(), mapped[["x", "y"]].to_numpy())
    assert list(ax.collections[0].get_array()) == mapped["layer"].tolist()
    numbers = [t.get_text() for t in ax.texts if t.get_gid() == "cluster"]
    assert sorted(numbers) == sorted(str(c) for c in set(mapped.loc[mapped["cluster_size"] > 1, "cluster"]))
    ax = draw_head_map(mapped, model=model, hue="pattern_type", ax=plt.figure().add_subplot())
    assert {c.get_label() for c in ax.collections} == set(mapped["pattern_type"])
    pngs = Pngs()
    comparison = compare_runs([headscan.load(tmp_path / "run")])
    blocks = families_section(comparison, pngs)
    other = next(o for o in atlas_data(comparison)["models"][0]["other"] if o["table"] == "similarity")
    assert len(other["at"]) == NEAREST * len(mapped)  # each head's nearest heads, not heads^2 rows
    square = _square(run["similarity"])
    first = [v for at, v in zip(other["at"], other["value"]) if at == 0]
    assert first == pytest.approx(sorted(square[0, 1:])[:NEAREST], abs=1e-5)
    assert [b.text for b in blocks if isinstance(b, Heading)] == ["Head families", "Pattern types"]
    assert "head_families.png" in dict(pngs)
    tables = [b for b in blocks if isinstance(b, Table)]
    assert tables[-1].frame["model"].tolist() == [model]  # heads per pattern type
    assert tables[-1].frame.drop(columns="model").astype(int).sum(axis=1).tolist() == [len(mapped)]
    assert set(tables[-1].numeric) == set(tables[-1].frame.columns) - {"model"}  # the counts, right-aligned
    captions = [b.caption for b in blocks if isinstance(b, Figures)]
    assert any(c.endswith("coloured by layer (left) and by pattern type (right); numbers are clusters.")
               for c in captions), captions


def test_a_stopped_sweep_resumes_to_the_same_similarity_sums(tiny_gpt2, tmp_path):
    from headscan.corpus import texts_corpus
    from headscan.errors import SweepInterrupted
    from headscan.models import load_model
    from headscan.scan.reduce import accumulate
    from headscan.scan.state import PartialState

    model = load_model(str(tiny_gpt2), device="cpu")
    corpus = texts_corpus(TEXTS, None)
    config = headscan.SweepConfig(similarity_sample=4, window=2, batch_size=1, bootstrap=0, device="cpu")
    whole = accumulate(model, corpus, config)
    path, checks = tmp_path / "state.npz", iter(range(100))
    with pytest.raises(SweepInterrupted):  # stopped in the third window, after two were saved
        accumulate(model, corpus, config, save=lambda s: s.save(path), save_every=0,
                   should_stop=lambda: next(checks) >= 5)
    saved = PartialState.load(path)
    assert saved.windows_done == 2 and saved.passes["similarity"].sums[1].max() > 0
    resumed = accumulate(model, corpus, config, state=saved)
    assert np.array_equal(resumed.passes["similarity"].sums, whole.passes["similarity"].sums)


def _plain_word_rows(attention: np.ndarray, word_ids: list[int], n_words: int) -> list[list[float]]:
    """Clark's word-level attention with a sink, by plain loops: row w is the mean over w's tokens of the
    attention summed over each word's tokens, then the rest (tokens of no word) as a last key."""
    rows = []
    for w in range(n_words):
        tokens = [t for t, owner in enumerate(word_ids) if owner == w]
        row = [0.0] * (n_words + 1)
        for t in tokens:
            for k, owner in enumerate(word_ids):
                if 0 <= owner < n_words:
                    row[owner] += float(attention[t, k]) / len(tokens)
                else:
                    row[n_words] += float(attention[t, k]) / len(tokens)
        rows.append(row)
    return rows


def test_similarity_across_models_equals_a_plain_loop_over_words(tiny_gpt2, tiny_bert, tmp_path):
    """Two tokenizers (byte-level BPE, WordPiece) over one treebank: each head of the causal model against each
    head of the encoder, by plain loops over Hugging Face's own attention (float64) on headscan's token -> word
    alignment (checked in test_syntax.py): a query word sees the sink and the words up to itself, each row
    renormalised over them and smoothed as Clark's."""
    from conftest import treebank_corpus

    from headscan.corpus import encode, read_corpus
    from headscan.models import load_model

    corpus_file = treebank_corpus(tmp_path, 6)
    run = headscan.sweep([str(tiny_gpt2), str(tiny_bert)], str(corpus_file), similarity_sample=3, dtype="float64",
                         bootstrap=0, device="cpu", batch_size=2)
    table = run["similarity_across"]
    segments = run.provenance.models[0].extra["similarity"]["segments"]
    corpus = read_corpus(corpus_file)
    rows = {}
    for folder, causal in ((tiny_gpt2, True), (tiny_bert, False)):
        model = load_model(str(folder), device="cpu")
        encoded = encode(corpus, model, 128, indices=segments)
        auto = AutoModelForCausalLM if causal else AutoModelForMaskedLM
        hf = auto.from_pretrained(folder, attn_implementation="eager", dtype=torch.float64).eval()
        for n, segment in enumerate(segments):
            with torch.no_grad():
                attentions = hf(torch.tensor([encoded.token_ids[n]]), output_attentions=True).attentions
            word_ids = list(encoded.word_ids[n])
            heads = torch.cat([a[0] for a in attentions]).numpy()  # (layer * head, n, n)
            rows[folder, segment] = ([_plain_word_rows(h, word_ids, max(word_ids) + 1) for h in heads],
                                     set(word_ids))
    size_a, size_b = len(rows[tiny_gpt2, segments[0]][0]), len(rows[tiny_bert, segments[0]][0])
    sums, queries = np.zeros((size_a, size_b)), 0
    for segment in segments:
        (a, words_a), (b, words_b) = rows[tiny_gpt2, segment], rows[tiny_bert, segment]
        n = min(len(a[0]), len(b[0]))
        for w in range(n):
            if w not in words_a or w not in words_b:
                continue
            queries += 1
            seen = list(range(w + 1))  # the words up to the query word (the GPT-2 is causal), then the sink
            for i in range(size_a):
                p = [a[i][w][k] for k in seen] + [a[i][w][-1]]
                for j in range(size_b):
                    q = [b[j][w][k] for k in seen] + [b[j][w][-1]]
                    sums[i, j] += _plain_js([x / sum(p) for x in p], [x / sum(q) for x in q])
    got = table.pivot(index=["layer", "head"], columns=["other_layer", "other_head"], values="value").to_numpy()
    np.testing.assert_allclose(got, sums / queries, rtol=0, atol=1e-9)
    assert (table["count"] == queries).all() and (table["model"] == str(tiny_gpt2)).all()
    # each row's own and other head by label too, as every table labels heads: L{layer}H{head}
    assert (table["label"] == "L" + table["layer"].astype(str) + "H" + table["head"].astype(str)).all()
    assert (table["other_label"] == "L" + table["other_layer"].astype(str) + "H" + table["other_head"].astype(str)).all()
    blocks = families_section(compare_runs([run]), Pngs())
    assert "The same heads in two models" in [b.text for b in blocks if isinstance(b, Heading)]
    closest = families.closest_across(table, top=3)
    assert closest["value"].tolist() == sorted(table["value"])[:3]

    # the atlas's panel: each head's nearest heads of the other model, the first model's (a row of the plain
    # matrix) and the second's too (a column: the table holds each pair once, under the first model)
    want = sums / queries
    models = {m["name"]: m for m in atlas_data(compare_runs([run]))["models"]}
    for name, matrix, other in ((str(tiny_gpt2), want, str(tiny_bert)), (str(tiny_bert), want.T, str(tiny_gpt2))):
        rows = next(o for o in models[name]["other"] if o["table"] == "similarity_across")
        assert sorted(set(rows["at"])) == list(range(len(matrix)))
        for i, line in enumerate(matrix):
            mine = [k for k, at in enumerate(rows["at"]) if at == i]
            assert [rows["value"][k] for k in mine] == pytest.approx(np.sort(line)[:NEAREST], rel=1e-4)
            assert {rows["cells"][rows["key"][k]][0] for k in mine} == {other}
    # two runs of the same two models: each run's other_model renamed as its model, so each panel lists its run's
    both = compare_runs([run, run], ["a", "b"])
    assert set(zip(both["similarity_across"]["model"], both["similarity_across"]["other_model"])) == \
        {(f"a:{tiny_gpt2}", f"a:{tiny_bert}"), (f"b:{tiny_gpt2}", f"b:{tiny_bert}")}
    second = next(m for m in atlas_data(both)["models"] if m["name"] == f"b:{tiny_bert}")
    rows = next(o for o in second["other"] if o["table"] == "similarity_across")
    assert len(rows["at"]) == NEAREST * size_b and {c[0] for c in rows["cells"]} == {f"b:{tiny_gpt2}"}


def test_the_similarity_budget_counts_every_key_of_a_bidirectional_model_and_half_of_a_causal_one():
    """check_memory's bytes against a hand count: layers x heads x entries x 4 bytes x segments of a batch, with
    n(n + 1) / 2 entries of a causal pattern (keys at or before the query) and n^2 of a bidirectional one."""
    from headscan.scan.similarity import check_memory, sample_of

    config = headscan.SweepConfig(max_len=10, batch_size=3, similarity_sample=8)
    assert check_memory("m", 2, 4, True, config, 10**6) == 2 * 4 * 55 * 4 * 3
    assert check_memory("m", 2, 4, False, config, 10**6) == 2 * 4 * 100 * 4 * 3
    # a sample is a draw without replacement: every segment at most once
    for seed in range(20):
        drawn = sample_of(12, 10, seed)
        assert len(set(drawn)) == 10 and drawn == sorted(drawn)


def test_pattern_types_at_the_thresholds_take_the_type_the_rule_says():
    """The rule's thresholds are inclusive ("sink + offset >= 0.5 with each >= 0.2"): heads exactly at them."""
    heads = pd.DataFrame({"model": "m", "layer": 0, "head": np.repeat(np.arange(4), 2),
                          "metric": ["first_token", "prev_token"] * 4,
                          "value": [0.2, 0.3, 0.3, 0.2, 0.5, 0.0, 0.19, 0.31]})
    assert families.pattern_types(heads)["pattern_type"].tolist() == ["vertical+diagonal", "vertical+diagonal",
                                                                      "vertical", "heterogeneous"]
