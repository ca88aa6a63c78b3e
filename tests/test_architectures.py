"""The support matrix: every architecture family, swept by headscan, agrees with Hugging Face's eager attention.

For each row of `headscan.testing.architectures.ARCHITECTURES`, a tiny random checkpoint is swept over a few
short sentences and every head metric, and its chance level, is compared, to 1e-6, with a plain loop over the
attention weights that the Hugging Face model returns with ``output_attentions=True`` under eager attention,
one sentence at a time (so the sweep's batching and padding are checked too); what each query sees, sliding
windows included, is read off those weights. Decoders are checked with BOS and without. Every row
is checked on the hooking path the matrix names, and on the ``hf_hooks`` path as well where that is the bridge.
"""

import functools
import math

import numpy as np
import pytest
import torch

from headscan import SweepConfig
from headscan.corpus import Corpus, Segment
from headscan.models import load_model
from headscan.scan import sweep_model
from headscan.scan.plan import fingerprint
from headscan.testing.architectures import ARCHITECTURES, build_architecture_checkpoint, support_matrix_markdown

SENTENCES = [
    "The old man walked down to the river.",
    "A small dog ran after the red ball, and the dog fell.",
    "We think it is a good idea.",
    "Open the door and close the window.",
    "She read the book twice: the book was long.",
    "Numbers like 10 and 42 appear too.",
    "Why did the children go home so early?",
    "The sun rose over the sea.",
]
CONFIG = SweepConfig(device="cpu", batch_size=3, bootstrap=0)  # batches of 3: padding inside most batches
TOLERANCE = 1e-6


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread, and the machine is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@functools.cache
def _checkpoint(name: str, folder: str) -> str:
    return str(build_architecture_checkpoint(folder, name))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("architectures")
    return lambda name: _checkpoint(name, str(root / name))


def _reference_ids(path: str, row, prepend_bos: bool) -> list[list[int]]:
    """Token ids built from the plain tokenizer: [CLS] ... [SEP] for encoders, BOS by hand for decoders."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if not row.causal:
        return [tokenizer(s)["input_ids"] for s in SENTENCES]
    bos = tokenizer.bos_token_id
    return [([bos] if prepend_bos else []) + tokenizer(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]


@functools.cache
def _eager_attentions(path: str, ids: tuple) -> list[np.ndarray]:
    """(layer, head, q, k) attention of one sentence from the checkpoint's own class, eager, float64."""
    import transformers

    model_class = getattr(transformers, transformers.AutoConfig.from_pretrained(path).architectures[0])
    model = _eager_model(model_class, path)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return np.stack([a[0].double().numpy() for a in out.attentions])


@functools.cache
def _eager_model(model_class, path: str):
    return model_class.from_pretrained(path, attn_implementation="eager").eval()


METRICS = ("prev_token", "next_token", "self", "first_token", "sep", "entropy", "entropy_norm", "distance",
           "positional_prev", "positional_next", "duplicate_token", "induction")


def _reference(path: str, ids: list[list[int]], causal: bool, sep: int | None) -> dict[str, dict[str, np.ndarray]]:
    """Every head metric and its chance as (layer, head), from plain loops over each query of each sentence:
    {"value": {metric: ...}, "chance": {metric: ...}}.

    Definitions as in headscan.metrics, specials kept: a metric's value is its mean over every query that
    counts for it, pooled over the sentences; NaN where no query counts. What a query sees is read off Hugging
    Face's own weights (the keys it puts weight on: causal mask and sliding window alike; a tiny random model
    underflows nowhere), so the configuration headscan reads its windows from is checked too. Chance is the
    same mean for uniform attention over those keys (an argmax metric: the chance that a uniform draw is the
    target).
    """
    first = _eager_attentions(path, tuple(ids[0]))
    sums = {kind: {metric: np.zeros(first.shape[:2]) for metric in METRICS} for kind in ("value", "chance")}
    counts = {metric: np.zeros(first.shape[:2]) for metric in METRICS}
    for tokens in ids:
        attention = _eager_attentions(path, tuple(tokens))
        n_layers, n_heads, n, _ = attention.shape
        for layer in range(n_layers):
            for head in range(n_heads):

                def add(metric, value, chance):
                    sums["value"][metric][layer, head] += value
                    sums["chance"][metric][layer, head] += chance
                    counts[metric][layer, head] += 1

                for q in range(n):
                    row = attention[layer, head, q]
                    top = int(np.argmax(row))
                    visible = [k for k in range(n) if row[k] > 0]
                    assert visible == [k for k in range(n) if attention[layer, 0, q, k] > 0]  # one mask per layer
                    uniform = 1 / len(visible)
                    if q >= 1:
                        add("prev_token", row[q - 1], uniform * (q - 1 in visible))
                        add("first_token", row[0], uniform * (0 in visible))
                        add("positional_prev", float(top == q - 1), uniform * (q - 1 in visible))
                    if q + 1 < n:
                        add("next_token", row[q + 1], uniform * (q + 1 in visible))
                        add("positional_next", float(top == q + 1), uniform * (q + 1 in visible))
                    add("self", row[q], uniform)
                    if sep is not None and sep in tokens:
                        add("sep", sum(row[k] for k in range(n) if tokens[k] == sep),
                            uniform * sum(tokens[k] == sep for k in visible))
                    entropy = -sum(row[k] * math.log(row[k]) for k in range(n) if row[k] > 0)
                    add("entropy", entropy, math.log(len(visible)))
                    if len(visible) >= 2:
                        add("entropy_norm", entropy / math.log(len(visible)), 1.0)
                    add("distance", sum(row[k] * abs(q - k) for k in range(n)),
                        uniform * sum(abs(q - k) for k in visible))
                    others = [j for j in visible if j != q and tokens[j] == tokens[q]]
                    if others:
                        add("duplicate_token", sum(row[j] for j in others), uniform * len(others))
                    # q-1 and q are never induction targets: a previous-token or self head would score there
                    # (under a sliding window j + 1 must be seen, j need not be)
                    targets = {j + 1 for j in (range(q) if causal else range(n))
                               if j != q and tokens[j] == tokens[q] and j + 1 not in (q - 1, q) and j + 1 in visible}
                    if targets:
                        add("induction", sum(row[k] for k in targets), uniform * len(targets))
    with np.errstate(invalid="ignore"):
        return {kind: {metric: np.where(counts[metric] > 0, sums[kind][metric] / counts[metric], np.nan)
                       for metric in METRICS} for kind in sums}


def _cases():
    for row in ARCHITECTURES:
        paths = [row.path] if row.path == "hf_hooks" else [row.path, "hf_hooks"]
        for path in paths:
            for bos in (True, False) if row.causal else (None,):
                label = f"{row.name}-{path}" + ("" if bos is None else f"-bos-{'yes' if bos else 'no'}")
                yield pytest.param(row, path, bos, id=label)


@pytest.mark.parametrize("row, path, prepend_bos", list(_cases()))
def test_every_head_metric_equals_hugging_face_eager_attention(checkpoint, monkeypatch, row, path, prepend_bos):
    folder = checkpoint(row.name)
    if path != row.path:  # the bridge's architectures, read through the second path as well
        monkeypatch.setattr("headscan.models.load.has_adapter", lambda config: False)
    model = load_model(folder, device="cpu", prepend_bos=prepend_bos)
    assert (model.path, model.family, model.n_layers, model.n_heads, model.n_kv_heads) == (
        path, row.family, 2, 4, row.n_kv_heads)
    ids = _reference_ids(folder, row, bool(prepend_bos))
    assert model.token_ids(SENTENCES) == ids
    assert model.provenance()["prepend_bos"] is bool(prepend_bos)

    tables = sweep_model(model, Corpus("test", "text", "", tuple(Segment(s, i + 1) for i, s in enumerate(SENTENCES))),
                         CONFIG)
    heads = tables.heads
    assert (heads["count"] > 0).groupby(heads["metric"]).any().sum() >= 6
    expected = _reference(folder, ids, row.causal, model.special_token_ids["sep"])
    compared = set(expected["value"]) & set(heads["metric"])
    assert {"prev_token", "next_token", "self", "first_token", "entropy", "distance"} <= compared
    for metric in sorted(compared):
        rows = heads[heads["metric"] == metric].sort_values(["layer", "head"])
        for kind in ("value", "chance"):
            np.testing.assert_allclose(rows[kind].to_numpy(), expected[kind][metric].ravel(), rtol=TOLERANCE,
                                       atol=TOLERANCE, err_msg=f"{metric} {kind}")


@pytest.mark.parametrize("row", [row for row in ARCHITECTURES if row.causal], ids=lambda row: row.name)
def test_default_bos_is_the_one_the_matrix_states(checkpoint, row):
    model = load_model(checkpoint(row.name), device="cpu")
    assert model.prepend_bos is row.default_bos and model.provenance()["prepend_bos"] is row.default_bos


def test_support_matrix_has_one_row_per_architecture():
    table = support_matrix_markdown()
    rows = table.strip().splitlines()[2:]
    assert len(rows) == len(ARCHITECTURES)
    for row, line in zip(ARCHITECTURES, rows):
        assert f"`{row.model_class}`" in line
    for family in ("BERT", "RoBERTa", "DistilBERT", "DeBERTa-v2", "ELECTRA", "GPT-2", "GPT-NeoX", "OPT", "Llama",
                   "Mistral", "Qwen2", "Gemma 2", "Phi", "BLOOM"):
        assert any(line.startswith(f"| {family}") for line in rows), family


@pytest.mark.parametrize("name, windows", [("mistral", [5, 5]), ("gemma2", [5, None]), ("gpt_neo", [None, 5]),
                                           ("modernbert", [None, 3]), ("llama", None)])
def test_provenance_names_each_layers_sliding_window(checkpoint, name, windows):
    """The largest |q - k| a query of each layer sees (SLIDING_WINDOW is 6: five keys back, or three either
    side in ModernBERT's window of 6); no entry where no layer has a window."""
    model = load_model(checkpoint(name), device="cpu")
    assert model.provenance().get("attention_windows") == windows
    assert "attention_not_modelled" not in model.provenance()
    # a state saved before windows were read (no entry) does not resume a windowed model's sweep; others resume
    corpus = Corpus("test", "text", "", (Segment(SENTENCES[0], 1),))
    assert fingerprint(model, corpus, CONFIG)["model"].get("windows") == windows
    if model.causal:  # and a retrieval trial decoded before (its rows misplaced) is not reused
        from headscan.retrieval_config import RetrievalConfig
        from headscan.scan.trials import _fingerprint

        assert _fingerprint(model, corpus, {"sha256": ""}, RetrievalConfig())["model"].get("windows") == windows
