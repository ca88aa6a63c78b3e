"""Importance for some models of a sweep (``--importance-model``): the named models' importance rows are those of a
sweep of that model alone with ``--importance``, to the bit; every other model and every control gets none and is
the sweep without importance; a stopped sweep resumed with another choice is refused, naming what differs; the
report's importance section names the models left out and says nothing else of them.
"""

import dataclasses

import pandas as pd
import pytest
import torch
from conftest import paragraph_corpus, stop_after

import headscan
from headscan.config import SweepConfig
from headscan.errors import ConfigError, SweepInterrupted, TablesError

SETTINGS = dict(device="cpu", bootstrap=20, batch_size=3, window=4, importance="ablate", bootstrap_unit="document")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run one thread (see tests/test_importance.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    return paragraph_corpus(tmp_path_factory.mktemp("lines"), 12)


def _rows(run, table: str, model: str) -> pd.DataFrame:
    return run[table][run[table]["model"] == model].reset_index(drop=True)


def test_only_the_named_model_gets_importance_and_its_rows_are_those_of_it_alone(tiny_gpt2, tiny_bert, lines):
    gpt2, bert = str(tiny_gpt2), str(tiny_bert)
    both = headscan.sweep([bert, gpt2], lines, control=("random-init",), importance_models=(gpt2,), **SETTINGS)
    assert set(both["importance"]["model"]) == {gpt2}  # not bert, not either control
    assert both.models == [bert, f"{bert} [random init]", gpt2, f"{gpt2} [random init]"]
    alone = headscan.sweep(gpt2, lines, **SETTINGS)
    pd.testing.assert_frame_equal(_rows(both, "importance", gpt2), alone["importance"], check_exact=True)
    assert alone["importance"]["value"].notna().sum() == 5 * 8  # every method of the 8 heads: a real comparison
    # the others are the sweep without importance, to the bit: no importance setting entered them
    plain = headscan.sweep(bert, lines, control=("random-init",), **(SETTINGS | {"importance": "off"}))
    for table in ("heads", "offsets"):
        for model in (bert, f"{bert} [random init]"):
            pd.testing.assert_frame_equal(_rows(both, table, model), _rows(plain, table, model), check_exact=True)
    # provenance: the run's settings name the model; only its own provenance says how importance was measured
    assert both.provenance.config["importance_models"] == [gpt2]
    assert [bool(m.extra.get("importance")) for m in both.provenance.models] == [False, False, True, False]


def test_a_stopped_sweep_resumed_with_another_choice_is_refused_and_resumes_with_its_own(tiny_gpt2, tiny_bert,
                                                                                      lines, tmp_path, monkeypatch):
    gpt2, bert = str(tiny_gpt2), str(tiny_bert)
    out = tmp_path / "run"
    settings = SETTINGS | {"bootstrap": 0}
    expected = headscan.sweep([gpt2, bert], lines, importance_models=(gpt2,), **settings)
    # gpt2 asks whether to stop at 12 points here, bert at 4 (once a window and once more): it stops after bert's first window
    monkeypatch.setattr("headscan.scan.run.stop_requests", stop_after(14))
    with pytest.raises(SweepInterrupted, match=f"stopped while sweeping {bert} at segment .*: the .* segments of its "
                                               "1 finished window"):
        headscan.sweep([gpt2, bert], lines, out, importance_models=(gpt2,), **settings)
    monkeypatch.undo()
    # gpt2's finished state was swept with importance, bert's part without: each other choice contradicts one
    for other in ((bert,), ()):
        with pytest.raises(TablesError, match=r"settings\.importance.*--restart"):
            headscan.sweep([gpt2, bert], lines, out, importance_models=other, **settings)
    resumed = headscan.sweep([gpt2, bert], lines, out, importance_models=(gpt2,), **settings)
    for table in ("heads", "importance"):
        pd.testing.assert_frame_equal(resumed[table], expected[table], check_exact=True)
    assert headscan.load(out).provenance.config["importance_models"] == [gpt2]


def test_a_model_left_out_keeps_the_fingerprint_of_a_sweep_without_importance(tiny_bert, lines):
    """So its saved state resumes and merges with one swept without importance, whatever the importance settings
    of the models that have it."""
    from headscan.corpus import read_corpus
    from headscan.models import load_model
    from headscan.scan.plan import fingerprint

    model, corpus = load_model(str(tiny_bert)), read_corpus(lines)
    chosen = SweepConfig(importance="ablate", importance_sample=5, ablate_first=True, mask_rate=0.3,
                         importance_models=("gpt2",), bootstrap_unit="segment")
    plain = dataclasses.replace(chosen, importance="off", importance_sample=None, ablate_first=False,
                                mask_rate=0.15, importance_models=())
    assert fingerprint(model, corpus, chosen) == fingerprint(model, corpus, plain)
    named = dataclasses.replace(chosen, importance_models=(model.name,))
    assert fingerprint(model, corpus, named)["settings"]["importance"] == "ablate"


def test_settings_are_checked(tiny_gpt2, lines):
    with pytest.raises(ConfigError, match="importance_models minilm names the models whose importance is measured, "
                                          "but importance is off; add --importance atp or --importance ablate"):
        SweepConfig(importance_models=("minilm",))
    with pytest.raises(ConfigError, match=r"importance_models: 'minilm \[random init\]' is a control, and controls "
                                          r"get no importance .* name the trained model \('minilm'\)"):
        SweepConfig(importance="atp", importance_models=("minilm [random init]",))
    with pytest.raises(ConfigError, match=r"importance_models: 'smollm2' is not a model of this sweep \(.*\); name "
                                          r"a model as --model names it"):
        headscan.sweep(str(tiny_gpt2), lines, importance="atp", importance_models=("smollm2",), device="cpu")
    config = SweepConfig(importance="atp", importance_models=("a", "b"))
    assert SweepConfig(**config.to_json()) == config  # as run.json gives it back (a list)


def test_the_cli_names_the_flag(tiny_gpt2, lines, tmp_path):
    from click.testing import CliRunner

    from headscan.cli import cli

    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_gpt2), "-c", str(lines), "--importance-model",
                                      str(tiny_gpt2), "--out", str(tmp_path / "o"), "-q"])
    assert result.exit_code != 0 and "--importance-model" in result.output and "importance is off" in result.output


def test_the_report_names_the_models_left_out_and_says_nothing_else_of_them(tiny_gpt2, tiny_bert, lines, tmp_path):
    """The importance section of the report (built alone: the whole report takes minutes here)."""
    from headscan.analysis.runs import compare_runs
    from headscan.report.document import Bullets, Table
    from headscan.report.figures import Pngs
    from headscan.report.sections.importance import importance_section

    gpt2, bert = str(tiny_gpt2), str(tiny_bert)
    run = headscan.sweep([gpt2, bert], lines, tmp_path / "run", control=("random-init",), importance_models=(gpt2,),
                         **(SETTINGS | {"ablate_top": 3}))
    blocks = importance_section(compare_runs([headscan.load(tmp_path / "run")]), Pngs())
    bullets = [item for block in blocks if isinstance(block, Bullets) for item in block.items]
    assert bullets[0].startswith(f"{gpt2} (`next_token_loss`; exact mean ablation for 3 of 8 heads")
    assert bullets[1] == (f"Not measured: {gpt2} [random init], {bert}, {bert} [random init] (the sweep measured "
                          f"importance only for {gpt2} (--importance-model), which leaves out every other model and "
                          "every control). Nothing in this section is said of them.")
    assert len(bullets) == 2  # no sentence on quiet heads of a model nothing ablated
    for table in (block.frame for block in blocks if isinstance(block, Table)):
        assert set(table.get("model", pd.Series([gpt2]))) <= {gpt2}
    assert set(run["importance"]["model"]) == {gpt2}
