"""A job registered from outside the package, with `headscan.scan.jobs.register_job` and no edit under headscan/:
it is a command (``headscan head-entropy``, in ``headscan --help``, with its options read off its config) and
``headscan.head_entropy``; a run publishes its table and run.json; a stop after the first model, or in the middle
of one, keeps what was done in OUT.partial/ and the same call resumes to tables equal to the bit to an
uninterrupted run's, and a crash resumes from the last save; a line per model says how far the run is; a model that
cannot be loaded is skipped.

The job: each head's mean attention entropy (nats) over the segments of a text file, each segment one bootstrap
unit, read off the Hugging Face model's own attention weights (eager attention); its chance is the entropy of
uniform attention over the keys each query sees. The values are checked against a plain loop over heads and
queries.
"""

import hashlib
import json
import math
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from conftest import stop_after

import headscan
from headscan.cli import cli
from headscan.cli_options import options_markdown
from headscan.errors import ConfigError, CorpusError, ModelLoadError, SweepInterrupted, TablesError
from headscan.scan.jobs import JOBS, Job, JobInput, ModelDone, register_job, registered_jobs
from headscan.scan.kept_trials import over_trials
from headscan.scan.resume import spec_stem
from headscan.setting import option
from headscan.tables import RUN_TABLES, TABLES, CorpusProvenance, ModelProvenance, head_columns, register_table

TEXTS = ["The cat sat on the mat.", "It slept all day long, and then it woke.", "Dogs bark.",
         "A bird sang in the tall tree by the river.", "Rain fell.", "We went home after the long walk in the park."]
HELP = "Each head's mean attention entropy over the segments of a text file."
CRASH_AT = None  # a segment the work fails on, as a killed process would stop there (a test sets it)


@dataclass(frozen=True)
class EntropyConfig:
    command: ClassVar[str] = "head-entropy"
    max_len: int = option(16, "input", "Tokens per segment at most.")
    seed: int = option(0, "intervals", "Seed of the bootstrap over segments.")
    bootstrap: int = option(20, "intervals", "Bootstrap replicates (0: none).", fingerprint=False)
    interval: Literal["percentile", "studentized"] = option("percentile", "intervals", "How replicates become an "
                                                            "interval.", fingerprint=False)


def read_texts(source, config: EntropyConfig) -> JobInput:
    path = Path(source)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file; pass a text file, one segment a line")
    data = path.read_bytes()
    lines = [line for line in data.decode().splitlines() if line.strip()]
    return JobInput(lines, CorpusProvenance(source=str(path), kind="text", sha256=hashlib.sha256(data).hexdigest(),
                                            n_segments=len(lines)))


def load_hf(spec: str, config: EntropyConfig):
    from transformers import AutoModel, AutoTokenizer

    try:
        model = AutoModel.from_pretrained(spec, attn_implementation="eager").eval()
        return spec, model, AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{spec}: cannot be loaded ({str(error).splitlines()[0]})") from None


def causal(model) -> bool:
    return model.config.model_type != "bert"


def entropy(loaded, given: JobInput, config: EntropyConfig, kept) -> ModelDone:
    import torch

    spec, model, tokenizer = loaded
    n, n_layers, n_heads = len(given.data), model.config.num_hidden_layers, model.config.num_attention_heads
    state = {name: array.copy() for name, array in kept.state.items()} if kept.state else {
        "sums": np.zeros((n, n_layers, n_heads)), "counts": np.zeros((n, n_layers, n_heads)),  # (segment, layer, head)
        "chance": np.zeros((n, n_layers))}  # (segment, layer)
    for i in range(kept.done, n):
        if i == CRASH_AT:
            raise RuntimeError(f"crashed at segment {i}")
        ids = tokenizer(given.data[i], return_tensors="pt", truncation=True, max_length=config.max_len)
        with torch.no_grad():
            pattern = torch.stack(model(**ids, output_attentions=True).attentions)[:, 0].double()  # (layer, head, q, k)
        queries = pattern.shape[-2]
        state["sums"][i] = (-torch.special.xlogy(pattern, pattern).sum(-1)).sum(-1).numpy()  # (layer, head)
        state["counts"][i] = queries
        keys = np.arange(1, queries + 1) if causal(model) else np.full(queries, queries)
        state["chance"][i] = np.log(keys).sum()
        kept.checkpoint(state, i + 1, n)
    values = over_trials(state["sums"], state["chance"], np.arange(n), config, bounds=(0.0, np.inf),
                         counts=state["counts"])
    layer, head = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    family = "causal" if causal(model) else "bidirectional"
    rows = pd.DataFrame(head_columns(spec, family, layer.ravel(), head.ravel(), head.ravel())
                        | {k: v.ravel() for k, v in values.items()})
    return ModelDone({"head_entropy": rows}, ModelProvenance(spec, family=family, n_layers=n_layers, n_heads=n_heads))


@pytest.fixture(scope="module", autouse=True)
def head_entropy_job():
    register_table("head_entropy", {}, "one row per (model, layer, head): mean attention entropy in nats")
    job = register_job(Job("head-entropy", HELP, EntropyConfig, ("head_entropy",), read=read_texts, work=entropy,
                           load=load_hf, unit="segment: each line of the file is one unit",
                           input_help="A text file, one segment a line.",
                           example="headscan head-entropy -m gpt2 --input texts.txt --out out/entropy"))
    yield job
    del JOBS["head-entropy"], TABLES["head_entropy"]  # other test modules see the registries as shipped
    RUN_TABLES.remove("head_entropy")


@pytest.fixture
def texts(tmp_path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return path


def plain_entropy(folder: Path, max_len: int) -> np.ndarray:
    """Each head's mean entropy over every query of every segment: a plain loop over heads, queries and keys."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(folder, attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    total, count = None, 0
    for text in TEXTS:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_len)
        layers = [a[0].tolist() for a in model(**ids, output_attentions=True).attentions]
        if total is None:
            total = [[0.0] * len(layers[0]) for _ in layers]
        for layer, heads in enumerate(layers):
            for head, rows in enumerate(heads):
                total[layer][head] += sum(-p * math.log(p) for row in rows for p in row if p > 0)
        count += len(layers[0][0])
    return np.array(total) / count


def run(models, texts, out, **keywords):
    return headscan.head_entropy([str(m) for m in models], texts, out, **keywords)


# --- a command and an entry point, from the registration alone ------------------------------------------------------


def test_it_is_a_command_listed_with_its_help_and_options():
    shown = CliRunner().invoke(cli, ["--help"], terminal_width=200).output
    assert "head-entropy" in shown and HELP in shown
    result = CliRunner().invoke(cli, ["head-entropy", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for expected in ("--input", "--max-len INTEGER", "Tokens per segment at most.", "[default: 16]", "--seed",
                     "--interval [percentile|studentized]", "--overwrite", "--restart", "--quiet",
                     "Example:", "headscan head-entropy -m gpt2 --input texts.txt --out out/entropy"):
        assert expected in result.output, expected
    text = options_markdown()
    assert "## headscan head-entropy\n\nFrom Python: `headscan.head_entropy`" in text and "`--max-len INTEGER`" in text
    assert "head-entropy" not in (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()


def test_every_registered_job_has_its_python_entry_point():
    assert {"import-scores", "head-entropy"} <= set(registered_jobs())
    for job in registered_jobs().values():
        assert callable(getattr(headscan, job.python_name)), job.name
    assert "head_entropy" in headscan.head_entropy.__doc__ and "Example" in headscan.head_entropy.__doc__


def test_a_name_is_registered_once():
    @dataclass(frozen=True)
    class OtherConfig(EntropyConfig):
        command: ClassVar[str] = "head-entropy-2"

    before = list(registered_jobs())
    for name in ("head-entropy", "import-scores"):
        with pytest.raises(ConfigError, match=f"a job named '{name}' is already registered"):
            register_job(Job(name, "x", EntropyConfig, ("head_entropy",), read_texts, entropy))
    with pytest.raises(ConfigError, match="class attribute command = 'other-entropy'"):
        register_job(Job("other-entropy", "x", EntropyConfig, ("head_entropy",), read_texts, entropy))
    with pytest.raises(ConfigError, match=r"tables \['nowhere'\] are not registered"):
        register_job(Job("head-entropy-2", "x", OtherConfig, ("nowhere",), read_texts, entropy))
    with pytest.raises(ConfigError, match="lower-case words joined by dashes"):
        register_job(Job("head_entropy_2", "x", OtherConfig, ("head_entropy",), read_texts, entropy))
    assert list(JOBS) == before  # nothing refused was registered


# --- a run: published, with provenance, checked against a plain loop --------------------------------------------------


def test_the_command_publishes_its_table_and_provenance(tiny_gpt2, tiny_bert, texts, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["head-entropy", "-m", str(tiny_gpt2), "-m", str(tiny_bert), "--input",
                                      str(texts), "--out", str(out), "--max-len", "12", "-q"], prog_name="headscan")
    assert result.exit_code == 0, result.output
    assert f"wrote {out}/head_entropy.parquet and {out}/run.json" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["head_entropy.parquet", "run.json"]
    assert not out.with_name("out.partial").exists()
    loaded = headscan.load(out)
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["git_revision"] and run_json["headscan_version"] == headscan.__version__
    assert run_json["command"].startswith("headscan head-entropy --model ") and "--max-len 12" in run_json["command"]
    assert run_json["config"] == {"max_len": 12, "seed": 0, "bootstrap": 20, "interval": "percentile"}
    assert run_json["corpus"]["sha256"] == hashlib.sha256(texts.read_bytes()).hexdigest()
    assert run_json["bootstrap_unit"] == "segment: each line of the file is one unit"
    assert loaded.models == [str(tiny_gpt2), str(tiny_bert)]
    for folder in (tiny_gpt2, tiny_bert):
        rows = loaded["head_entropy"][loaded["head_entropy"]["model"] == str(folder)]
        expected = plain_entropy(folder, 12)
        np.testing.assert_allclose(rows["value"].to_numpy(), expected.ravel(), rtol=1e-9)
        assert (rows["ci_low"] <= rows["value"]).all() and (rows["value"] <= rows["ci_high"]).all()
        assert (rows["value"] <= rows["chance"] + 1e-9).all()  # uniform attention has the most entropy
    refused = CliRunner().invoke(cli, ["head-entropy", "-m", str(tiny_gpt2), "--input", str(tmp_path / "none.txt"),
                                       "--out", str(tmp_path / "o2")])
    assert refused.exit_code == 1 and refused.output.startswith("Error: ") and "none.txt: no such file" in refused.output
    assert "Traceback" not in refused.output and not (tmp_path / "o2").exists()


@pytest.mark.parametrize("stop_at, kept", [
    (len(TEXTS), r"stopped after .*tiny-gpt2.*, 1 of 2 models finished: kept in .*out\.partial; run the same command "
                 r"again to resume"),
    (3, r"stopped while running head-entropy on .*tiny-gpt2.*: 4 of 6 steps are kept in .*out\.partial"),
])
def test_a_stopped_run_resumes_to_the_bit(tiny_gpt2, tiny_bert, texts, tmp_path, monkeypatch, capsys, stop_at, kept):
    whole = run([tiny_gpt2, tiny_bert], texts, tmp_path / "whole")
    out = tmp_path / "out"
    monkeypatch.setattr("headscan.scan.runner.stop_requests", stop_after(stop_at))
    with pytest.raises(SweepInterrupted, match=kept):
        run([tiny_gpt2, tiny_bert], texts, out)
    assert not out.exists()  # a stopped run publishes nothing, only its partial folder
    partial = out.with_name("out.partial")
    stem = "job-head-entropy-" + spec_stem(str(tiny_gpt2))
    expected = [f"{stem}.head_entropy.parquet", f"{stem}.json"] if stop_at == len(TEXTS) else [f"{stem}.npz"]
    assert sorted(p.name for p in partial.iterdir()) == sorted(expected)
    monkeypatch.undo()
    with pytest.raises(TablesError, match=r"other inputs \(settings.max_len: 16 != 12\).*--restart"):
        run([tiny_gpt2, tiny_bert], texts, out, max_len=12)
    capsys.readouterr()
    resumed = run([tiny_gpt2, tiny_bert], texts, out, progress=True)
    lines = capsys.readouterr().err
    if stop_at == len(TEXTS):
        assert f"head-entropy: model 1 of 2, {tiny_gpt2}: kept from {partial}" in lines
    else:
        assert f"head-entropy: resuming {tiny_gpt2} at 4 of 6" in lines
    assert f"head-entropy: model 2 of 2, {tiny_bert}: done in " in lines
    assert not partial.exists()
    a, b = headscan.load(tmp_path / "whole"), headscan.load(out)
    pd.testing.assert_frame_equal(a["head_entropy"], b["head_entropy"], check_exact=True)
    pd.testing.assert_frame_equal(whole["head_entropy"], resumed["head_entropy"], check_exact=True)


def test_a_model_that_cannot_be_loaded_is_skipped(tiny_gpt2, texts, tmp_path, capsys):
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(Path(tiny_gpt2) / "config.json", broken / "config.json")  # found, but no weights to load
    result = run([tiny_gpt2, broken], texts, tmp_path / "out")
    assert result.models == [str(tiny_gpt2)]
    assert f"skipped {broken}: {broken}: cannot be loaded" in capsys.readouterr().err
    assert str(broken) in headscan.load(tmp_path / "out").provenance.extra["skipped"]
    with pytest.raises(ModelLoadError, match="cannot be loaded"):  # the only model: nothing to publish
        run([broken], texts, tmp_path / "o2")


def test_a_crashed_run_resumes_from_its_last_save(tiny_gpt2, texts, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    monkeypatch.setattr(sys.modules[__name__], "CRASH_AT", 4)
    with pytest.raises(RuntimeError, match="crashed at segment 4"):
        run([tiny_gpt2], texts, out, save_every=0)  # kept at every checkpoint, as --save-every 0 would
    monkeypatch.undo()
    capsys.readouterr()
    resumed = run([tiny_gpt2], texts, out, progress=True)
    assert f"head-entropy: resuming {tiny_gpt2} at 4 of 6" in capsys.readouterr().err
    whole = run([tiny_gpt2], texts, None)
    pd.testing.assert_frame_equal(resumed["head_entropy"], whole["head_entropy"], check_exact=True)
