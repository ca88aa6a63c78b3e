"""experiments/syntax_held_out.py end to end on minilm: re-estimated on the very sentences it was chosen on, each
finding's paired difference is the in-sample one it was chosen with (the same head, offset and dependents)."""

from pathlib import Path

import numpy as np
import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "syntax_held_out.py"


def test_syntax_held_out_on_the_same_sentences_finds_its_in_sample_differences(minilm, ewt_dev, tmp_path,
                                                                                monkeypatch, capsys, load_script):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))  # the script imports its _common module
    script = load_script(SCRIPT, "experiment_syntax_held_out")
    rc = script.main(["--dev", str(ewt_dev), "--dev-limit", "320", "--test", str(ewt_dev), "--test-limit", "320",
                      "--control-seeds", "1", "--out", str(tmp_path)])
    assert rc in (0, 1)
    found = pd.read_csv(tmp_path / "findings.csv")
    assert len(found) and found["finding_held_out"].any()
    np.testing.assert_allclose(found["test320_vs"], found["dev_vs_in_sample"], rtol=0, atol=1e-12)
    assert (found["test320_kept"] == (found["dev_low_in_sample"] > 0)).all()
    readme = (tmp_path / "README.md").read_text()
    assert "## Kept on test" in readme and ("**PASS**" in readme or "**FAIL**" in readme)
    assert "python experiments/syntax_held_out.py" in readme


def test_syntax_held_out_refuses_a_corpus_without_trees(tmp_path, monkeypatch, capsys, load_script):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    script = load_script(SCRIPT, "experiment_syntax_held_out")
    assert script.main(["--dev", "builtin", "--out", str(tmp_path)]) == 2
    assert "CoNLL-U" in capsys.readouterr().out
