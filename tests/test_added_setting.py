"""A sweep setting added from outside the package, declared once with `headscan.register_setting` and no edit under
headscan/: it is an option of ``headscan sweep`` (its --help lists it) and a keyword of `headscan.sweep`, it enters
the fingerprint (a stopped sweep with another value does not resume), it reaches the code that uses it (a pass
registered here reads it from the plan's config), and docs/options.md as generated lists it.

The pass caps each segment's real tokens (padding excluded) at the setting's value and adds them up; the total is
checked against the tokenizer's own counts, capped by hand.
"""

from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from click.testing import CliRunner

import headscan
from headscan.cli import cli
from headscan.cli_options import options_markdown
from headscan.errors import ConfigError, SweepInterrupted, TablesError
from headscan.scan.passes import PASSES, Pass, PassRun, register_pass
from headscan.setting import ADDED, fingerprinted

TEXTS = ["The cat sat on the mat.", "It slept all day long, and then it woke.", "Dogs bark.",
         "A bird sang in the tall tree by the river.", "Rain fell.", "We went home after the long walk in the park."]
SETTINGS = dict(device="cpu", window=2, batch_size=2, bootstrap=0, max_len=64)
HELP = "Cap each segment's real tokens at N and add them up (0: off)."


@dataclass
class CappedState:
    cap: int  # the value the pass was handed, as it read it from the plan's config
    total: int = 0


class _Capping(PassRun):
    def __init__(self, state: CappedState):
        self.state = state

    def begin_window(self) -> None:
        self.window = 0

    def after_batch(self, step) -> None:
        real = step.batch.attention_mask.sum(-1).tolist()  # (batch,)
        self.window += sum(min(int(n), self.state.cap) for n in real)

    def end_window(self) -> None:
        self.state.total += self.window


class CappedTokensPass(Pass):
    """The setting's consumer: it reads ``plan.config.token_cap`` like any field of the config."""

    name = "capped_tokens"

    def wanted(self, plan) -> bool:
        return plan.config.token_cap > 0

    def empty(self, plan, model):
        return CappedState(plan.config.token_cap)

    def open(self, run, state):
        return _Capping(state)

    def save(self, state):
        return {"cap": state.cap}, {"total": np.array([state.total], dtype=np.int64)}

    def load(self, header, arrays):
        return CappedState(header["cap"], int(arrays["total"][0]))

    def notes(self, state):
        return {"capped_tokens": {"cap": state.cap, "total": state.total}}


@pytest.fixture(scope="module", autouse=True)
def token_cap():
    one = headscan.register_setting("token_cap", 0, int, "scores", HELP, metavar="N", check=_whole)
    register_pass(CappedTokensPass())
    yield one
    del ADDED["sweep"]["token_cap"], PASSES["capped_tokens"]  # other test modules see the registries as shipped


def _whole(value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"token_cap must be a whole number >= 0, got {value!r}", setting="token_cap")


def _capped(tiny_bert, cap: int) -> int:
    """The sum over TEXTS of each one's tokens by the tokenizer itself, capped at `cap`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert))
    return sum(min(len(tokenizer(text)["input_ids"]), cap) for text in TEXTS)


def test_sweep_help_lists_the_added_option_in_its_group():
    shown = CliRunner().invoke(cli, ["sweep", "--help"], terminal_width=200).output
    scores = shown[shown.index("What is scored options:"):shown.index("Intervals options:")]
    assert "--token-cap N" in scores and HELP in scores and "[default: 0]" in scores


def test_docs_options_md_as_generated_lists_it_under_sweep():
    text = options_markdown()
    sweep = text[text.index("## headscan sweep"):text.index("## headscan retrieval")]
    scores = sweep[sweep.index("### What is scored"):sweep.index("### Intervals")]
    # click's own help record (two spaces before the default), after the declared options of its group
    assert [line for line in scores.splitlines() if line][-1] == f"- `--token-cap N`: {HELP}  [default: 0]"
    shipped = (Path(__file__).resolve().parents[1] / "docs" / "options.md").read_text()
    assert "--token-cap" not in shipped  # the shipped page is generated from the registries as shipped


def test_it_enters_the_fingerprint(tiny_models):
    from headscan.corpus import texts_corpus
    from headscan.scan import fingerprint
    from headscan.scan.resume import check_resumable
    from headscan.scan.state import PartialState

    assert fingerprinted(headscan.SweepConfig)[-1] == "token_cap"
    model, corpus = tiny_models["bert"], texts_corpus(TEXTS, None)
    base = fingerprint(model, corpus, headscan.SweepConfig(device="cpu"))
    other = fingerprint(model, corpus, headscan.SweepConfig(device="cpu", extra={"token_cap": 3}))
    assert base["settings"]["token_cap"] == 0 and other["settings"]["token_cap"] == 3
    saved = PartialState.empty(base, None, (2, 4, 3), 20)
    with pytest.raises(TablesError, match=r"with other inputs \(.*settings.token_cap: 0 != 3"):
        check_resumable(saved, other, None, "x.npz", "m")


def test_the_command_line_value_reaches_the_pass_that_uses_it(tiny_bert, tmp_path):
    corpus = tmp_path / "texts.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_bert), "-c", str(corpus), "--out", str(out), "-q",
                                      "--device", "cpu", "--bootstrap", "0", "--token-cap", "7"])
    assert result.exit_code == 0, result.output
    run = headscan.load(out)
    assert run.provenance.config["extra"] == {"token_cap": 7}
    assert "--token-cap 7" in run.provenance.command
    assert run.provenance.models[0].extra["capped_tokens"] == {"cap": 7, "total": _capped(tiny_bert, 7)}
    refused = CliRunner().invoke(cli, ["sweep", "-m", str(tiny_bert), "-c", str(corpus), "--out", str(tmp_path / "o2"),
                                       "--token-cap", "-1"])
    assert refused.exit_code == 1 and "Error: --token-cap must be a whole number >= 0, got -1" in refused.output


def test_a_stopped_sweep_with_another_value_does_not_resume(tiny_bert, tmp_path):
    from headscan.scan import run

    out = tmp_path / "out"
    calls = iter(range(100))
    with mock.patch.object(run, "stop_requests") as stop, pytest.raises(SweepInterrupted):
        stop.return_value.__enter__.return_value = lambda: next(calls) >= 2
        headscan.sweep(str(tiny_bert), TEXTS, out, save_every=0, token_cap=5, **SETTINGS)
    with pytest.raises(TablesError, match=r"a stopped sweep of .* with other inputs \(settings.token_cap: 5 != 6\)"):
        headscan.sweep(str(tiny_bert), TEXTS, out, token_cap=6, **SETTINGS)
    resumed = headscan.sweep(str(tiny_bert), TEXTS, out, token_cap=5, **SETTINGS)  # the same value resumes
    assert resumed.provenance.models[0].extra["capped_tokens"] == {"cap": 5, "total": _capped(tiny_bert, 5)}
    assert "token_cap=5" in resumed.provenance.command  # the Python call, recorded as it was made


def test_a_setting_is_registered_once_and_refused_where_taken():
    with pytest.raises(ConfigError, match=r"sweep already has a setting or option named 'token_cap'"):
        headscan.register_setting("token_cap", 1, int, "scores", HELP)
    for name in ("max_len", "out", "shard"):  # a field, and options that are no setting
        with pytest.raises(ConfigError, match=rf"already has a setting or option named '{name}'"):
            headscan.register_setting(name, 1, int, "scores", HELP)
    with pytest.raises(ConfigError, match=r"already has the flag --bos"):
        headscan.register_setting("bos_too", 1, int, "scores", HELP, flag="--bos")
    with pytest.raises(ConfigError, match=r"command 'retrieval' takes no added settings"):
        headscan.register_setting("other", 1, int, "scores", HELP, command="retrieval")
    with pytest.raises(ConfigError, match=r"group must be one of"):
        headscan.register_setting("other", 1, int, "nowhere", HELP)
    assert list(ADDED["sweep"]) == ["token_cap"]  # nothing refused was registered


def test_an_unregistered_setting_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['token_kap'\]"):
        headscan.sweep("x", TEXTS, None, token_kap=3)
    with pytest.raises(ConfigError, match=r"token_kap: not a setting of headscan sweep"):
        headscan.SweepConfig(extra={"token_kap": 3})
