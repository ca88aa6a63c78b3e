"""The command line's options, each declared once, and docs/options.md generated from them.

A config field's option comes from the field itself (its type, default and `headscan.setting.Setting`), in the
order of the config's fields; the options that are no setting (where to write, whether to resume) are declared here.
`OPTIONS` lists each command's options in order: an option two commands share is the same `Opt`, so `sweep` and
`retrieval` cannot drift apart. A setting added from outside (`register_setting`) becomes an option of its command
when the command is parsed or its help shown (`GroupedCommand`), listed after the declared ones of its group.
``python -m headscan.cli_options`` rewrites docs/options.md; tests/test_cli_options.py fails when it has drifted.
This module parses nothing and runs nothing: `headscan.cli` applies these options to its commands.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import click

from .config import SweepConfig
from .errors import ConfigError
from .patching_config import PatchConfig
from .retrieval_config import RetrievalConfig
from .scan.jobs import JOBS, Job
from .setting import ADDED, AddedSetting, Setting, added, settings, with_settings
from .tables import TABLES

__all__ = ["Opt", "OPTIONS", "ENTRY_POINTS", "TITLES", "GroupedCommand", "options", "command_options", "config_from",
           "job_options", "declared_options", "job_commands",
           "flag_of", "shown_opts", "options_markdown", "register_setting"]

# Section titles of --help and docs/options.md, in order: the groups of headscan.config.GROUPS, and "report".
TITLES = {"input": "Input", "model": "Model and memory", "scores": "What is scored", "intervals": "Intervals",
          "trials": "Trials", "report": "What is shown", "run": "Output and running"}
DROP = object()  # Opt.but(default=DROP): no default at all
TRISTATE = {"auto": None, "yes": True, "no": False}  # a `bool | None` setting on the command line (--bos)


class _Option(click.Option):
    """A click option that knows its declaration and group, and can keep an old spelling working unlisted."""

    def __init__(self, *args, declared: Opt, group: str, old: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.declared, self.group, self.old = declared, group, old

    @contextmanager
    def _shown(self):
        opts, self.opts = self.opts, [o for o in self.opts if o not in self.old]
        try:
            yield
        finally:
            self.opts = opts

    def get_help_record(self, ctx):
        with self._shown():
            return super().get_help_record(ctx)

    def get_error_hint(self, ctx):
        with self._shown():
            return super().get_error_hint(ctx)


@dataclasses.dataclass(frozen=True, eq=False)
class Opt:
    """One option as declared: click's declarations (the parameter's name first), its group and help, and the rest
    of click's keywords. Applied to a command, it adds a fresh `click.Option` that points back here."""

    decls: tuple[str, ...]
    group: str
    help: str
    kwargs: dict = dataclasses.field(default_factory=dict)
    old: tuple[str, ...] = ()  # spellings still accepted, not listed in --help

    def __post_init__(self):
        if self.group not in TITLES or not self.help:  # a slip in a declaration below, caught on import
            raise ValueError(f"option {self.decls}: needs help and a group of {', '.join(TITLES)}")

    @property
    def name(self) -> str:
        return self.decls[0]

    def __call__(self, command):
        return click.option(*self.decls, *self.old, cls=_Option, declared=self, group=self.group, old=self.old,
                            help=self.help, **self.kwargs)(command)

    def option(self) -> click.Option:
        """A fresh `click.Option` of this declaration (what `__call__` adds to a command)."""
        return _Option((*self.decls, *self.old), declared=self, group=self.group, old=self.old, help=self.help,
                       **self.kwargs)

    def but(self, **changes) -> Opt:
        """This option as one command varies it: `help`, `old` or click keywords (`default`, `required`, ...);
        a keyword given as `DROP` is left out (a required option has no default)."""
        fields = {key: changes.pop(key) for key in ("help", "old") if key in changes}
        kwargs = {key: value for key, value in {**self.kwargs, **changes}.items() if value is not DROP}
        return dataclasses.replace(self, kwargs=kwargs, **fields)


def _numbers(kind: type, setting: str):
    """A click callback: "1024,2048" to a tuple of `kind`, or click's refusal naming the setting."""
    def parse(context, parameter, value):
        try:
            return tuple(kind(part) for part in str(value).split(",") if part.strip())
        except ValueError:
            raise click.BadParameter(f"{setting} must be numbers separated by commas, got {value!r}") from None
    return parse


def _tristate(hint) -> bool:
    """Whether a field's type is `bool | None`: yes, no, or the model's own default."""
    return get_origin(hint) in (Union, types.UnionType) and set(get_args(hint)) == {bool, type(None)}


def _from_config(config: type, name: str) -> Opt:
    """The option of field `name` of `config`, read off its type, default and `Setting`."""
    field = next(f for f in dataclasses.fields(config) if f.name == name)
    return _declared(name, get_type_hints(config)[name], field.default, field.metadata["setting"])


def _declared(name: str, hint, default, setting: Setting) -> Opt:
    """The option of a setting `name` of type `hint` (a field's annotation), read off it, `default` and `setting`;
    KeyError for a type the command line cannot parse."""
    flag = setting.flag or "--" + name.replace("_", "-")
    decls, kwargs = (name, flag), {"default": default, "show_default": True}
    args = tuple(a for a in get_args(hint) if a is not type(None))
    if setting.metavar:
        kwargs["metavar"] = setting.metavar
    if get_origin(hint) is Literal:
        kwargs["type"] = click.Choice(args)
    elif hint is bool:
        decls = (name, f"{flag}/--no-{flag[2:]}")
    elif _tristate(hint):
        kwargs |= {"type": click.Choice(list(TRISTATE)), "default": "auto"}
    elif get_origin(hint) is tuple and get_origin(args[0]) is Literal:
        kwargs = {"multiple": True, "type": click.Choice(get_args(args[0]))}
    elif get_origin(hint) is tuple and args[0] is str:
        kwargs = {"multiple": True, "type": click.STRING} | ({"metavar": setting.metavar} if setting.metavar else {})
    elif args and get_origin(args[0]) is tuple:  # optional numbers (--layers 0,5-7): the config parses the text
        kwargs["type"] = click.STRING
    elif get_origin(hint) is tuple:
        kwargs |= {"default": ",".join(f"{value:g}" for value in default), "callback": _numbers(args[0], name)}
    else:
        kwargs["type"] = {int: click.INT, float: click.FLOAT, str: click.STRING}[args[0] if args else hint]
    return Opt(decls, setting.group, setting.help, kwargs)


def _shared() -> dict[str, Opt]:
    """The options of settings both configs declare alike (one `Setting`, one default): one `Opt` each."""
    sweep, retrieval = settings(SweepConfig), settings(RetrievalConfig)
    defaults = {config: {f.name: f.default for f in dataclasses.fields(config)} for config in (SweepConfig, RetrievalConfig)}
    return {name: _from_config(SweepConfig, name) for name in sweep
            if retrieval.get(name) is sweep[name] and defaults[SweepConfig][name] == defaults[RetrievalConfig][name]}


SHARED = _shared()  # --device, --dtype, --bootstrap, --interval


def _config_options(config: type) -> dict[str, Opt]:
    return {name: SHARED.get(name) or _from_config(config, name) for name in settings(config)}


SWEEP, RETRIEVAL, PATCH = _config_options(SweepConfig), _config_options(RetrievalConfig), _config_options(PatchConfig)

_PATH = click.Path(file_okay=False, path_type=Path)
MODEL = Opt(("models", "--model", "-m"), "input", "Alias (minilm, smollm2), local checkpoint folder, .gguf file or "
            "Hugging Face id; repeat for several models. Default: minilm and smollm2.", {"multiple": True, "metavar": "SPEC"})
CORPUS = Opt(("corpus", "--corpus", "-c"), "input", "A .txt (one segment per line), .jsonl (a 'text' field) or "
             ".conllu file, 'builtin', 'repeat-random[:n=50,count=64,seed=0]', or a Hugging Face dataset, one segment "
             "per row: 'hf:NAME[:config=...,split=train,field=text,revision=...]' (a save_to_disk folder, a folder of "
             "data files, or a Hub id).",
             {"default": "builtin", "show_default": True, "metavar": "PATH|builtin|repeat-random|hf:NAME"})
OUT = Opt(("out", "--out", "-o"), "run", "Folder for the tables (a parquet file each) and run.json.",
          {"default": "out", "show_default": True, "type": _PATH})
OVERWRITE = Opt(("overwrite", "--overwrite"), "run", "Replace OUT if it already holds a headscan run (its run.json).",
                {"is_flag": True})
RESTART = Opt(("restart", "--restart"), "run", "Discard what a stopped run kept in OUT.partial/ instead of resuming "
              "from it.", {"is_flag": True})
QUIET = Opt(("quiet", "--quiet", "-q"), "run", "No progress bar or progress lines.", {"is_flag": True})

OPTIONS: dict[str, list[Opt]] = {
    "sweep": [
        MODEL, CORPUS, OUT, *SWEEP.values(),
        Opt(("save_every", "--save-every"), "run", "Save the partial state at the first window end after this many "
            "seconds.", {"default": 120.0, "show_default": True, "metavar": "SECONDS"}),
        Opt(("shard", "--shard"), "run", "Sweep only the K-th of N disjoint parts of the corpus (K from 0); combine "
            "with `headscan merge`.", {"default": None, "metavar": "K/N"}),
        OVERWRITE, RESTART,
        Opt(("ray", "--ray"), "run", "Run on a Ray cluster, as many workers as its nodes' memory holds: --ray alone "
            "starts or uses a local instance; --ray auto, --ray HOST:6379 or --ray ray://HOST:10001 connect to one "
            "(pip install 'headscan[ray]').",
            {"is_flag": False, "flag_value": True, "default": None, "type": click.UNPROCESSED, "metavar": "[ADDRESS]"}),
        QUIET,
        Opt(("checkpoints", "--checkpoints"), "input", "Also sweep every checkpoint folder inside FOLDER "
            "(save_pretrained folders named step1000, step-1000, step_1000 or checkpoint-1000), in order of step; "
            "each model's provenance records its step.",
            {"default": None, "type": click.Path(path_type=Path), "metavar": "FOLDER"}),
    ],
    "retrieval": [
        MODEL.but(help="A causal model: alias (smollm2), local checkpoint folder, .gguf file or Hugging Face id; "
                  "repeat for several.", required=True),
        # -c names the corpus in every command; --haystack, its first spelling here, still works
        CORPUS.but(help="The corpus the haystacks are cut from: any corpus headscan sweeps (.txt, .jsonl, .conllu).",
                   old=("--haystack",), required=True, default=DROP, show_default=DROP, metavar="PATH|builtin"),
        Opt(("needles", "--needles"), "trials", 'JSONL of {"needle", "question", "answer"} (default: headscan\'s own, '
            "invented facts).", {"default": None, "type": click.Path(dir_okay=False, path_type=Path)}),
        OUT.but(help="Folder for the tables and run.json.", default="out/retrieval"),
        *RETRIEVAL.values(), OVERWRITE, RESTART, QUIET,
    ],
    "patch": [
        MODEL.but(help="A causal language model: alias (smollm2), local checkpoint folder, .gguf file or Hugging Face "
                  "id; repeat for several.", required=True),
        Opt(("pairs", "--pairs"), "input", 'JSONL of {"clean", "corrupted", "answer", "wrong"}, one pair a line '
            "(headscan pairs writes some).", {"required": True, "type": click.Path(dir_okay=False, path_type=Path)}),
        Opt(("select_pairs", "--select-pairs"), "input", "Choose --path-top's candidates on these pairs (same "
            "format) and estimate the paths on every pair of --pairs (default: the odd lines of --pairs choose, the "
            "even lines estimate).", {"default": None, "type": click.Path(dir_okay=False, path_type=Path)}),
        OUT.but(help="Folder for patching.parquet, paths.parquet and run.json.", default="out/patch"),
        *PATCH.values(), OVERWRITE, RESTART, QUIET,
    ],
    "pairs": [
        Opt(("n", "--n"), "input", "How many pairs.", {"default": 64, "show_default": True, "type": click.IntRange(min=1)}),
        Opt(("seed", "--seed"), "input", "Seed of the draws from the word lists.",
            {"default": 0, "show_default": True, "type": click.IntRange(min=0)}),
        Opt(("model", "--model", "-m"), "input", "Keep only words that are one token for this model, so each pair's "
            "prompts have the same number of tokens.", {"default": None, "metavar": "SPEC"}),
        OUT.but(help="The JSONL file to write.", required=True, default=DROP, show_default=DROP,
                type=click.Path(dir_okay=False, path_type=Path)),
        OVERWRITE.but(help="Replace OUT if it exists."),
    ],
    "merge": [OUT.but(help="Folder for the merged tables.", required=True, default=DROP, show_default=DROP),
              OVERWRITE],
    "export": [OUT.but(help="Folder for the dataset (data/TABLE.parquet, run.json, README.md).", required=True,
                       default=DROP, show_default=DROP),
               OVERWRITE.but(help="Replace OUT if it already holds a dataset export.")],
    "import-scores": [
        OUT.but(help="Folder for retrieval.parquet and run.json.", required=True, default=DROP, show_default=DROP),
        Opt(("model", "--model", "-m"), "input", "The model's name in the tables (default: the file's name without "
            ".json).", {"default": None, "metavar": "NAME"}),
        RETRIEVAL["seed"].but(help="Seed of the bootstrap over trials."), RETRIEVAL["bootstrap"], RETRIEVAL["interval"],
        OVERWRITE],
    "models": [],
    "show": [
        Opt(("metric", "--metric"), "report", "What to rank heads by: a metric of heads.parquet or value.parquet, a "
            "profile (offsets, first_token_by_position, distance_by_position), copying, syntax, importance, retrieval "
            "or retrieval_ungated (default: prev_token for a sweep, retrieval for a retrieval run).",
            {"default": None, "metavar": "NAME"}),
        Opt(("top", "--top"), "report", "How many heads per model.",
            {"default": 10, "show_default": True, "type": click.IntRange(min=1)}),
    ],
    "report": [
        OUT.but(help="Report folder (default: NAME-report beside the first run's folder).", default=None,
                show_default=False),
        OVERWRITE.but(help="Replace OUT if it already holds a headscan report."),
        Opt(("top", "--top"), "report", "Top heads listed per metric.", {"default": 10, "show_default": True}),
        Opt(("example", "--example"), "report", "Sentence whose attention is drawn for each model's heads (default: "
            "a short English one).", {"default": None}),
        Opt(("no_models", "--no-models"), "report", "Draw only what needs the tables, without loading the models.",
            {"is_flag": True}),
        QUIET,
    ],
}


# Each command's Python entry point: ``headscan COMMAND`` parses its options and calls ``headscan.NAME`` (`headscan.cli`
# looks the function up here), which docs/options.md names under the command; tests/test_entry_points.py checks
# that each one imports and is what its command calls.
ENTRY_POINTS = {"sweep": "sweep", "retrieval": "retrieval", "patch": "patch", "pairs": "pairs", "merge": "merge",
                "export": "export", "import-scores": "import_scores", "models": "describe_models", "show": "show",
                "report": "report"}


# The commands whose settings are a config's fields: their options, fingerprint and added settings come from it.
CONFIGS = {config.command: config for config in (SweepConfig, RetrievalConfig, PatchConfig)}


def job_options(job: Job) -> list[Opt]:
    """The options of the command made for a registered job (`headscan.scan.jobs`): its models and input, its
    output, then its config's fields, each read off the field as a sweep's are, then how it runs."""
    return [MODEL.but(help="Alias, local checkpoint folder, .gguf file or Hugging Face id; repeat for several "
                      "models." if job.specs else "A name for the models in the tables; repeat for several.",
                      required=True),
            Opt(("source", "--input", "-i"), "input", job.input_help, {"required": True, "metavar": "INPUT"}),
            OUT.but(help=f"Folder for {', '.join(TABLES[name].file for name in job.tables)} and run.json.",
                    default=f"out/{job.name}"),
            *(_from_config(job.config, name) for name in settings(job.config)), OVERWRITE, RESTART, QUIET]


def declared_options(command: str) -> list[Opt]:
    """The options declared for `command`: a hand-written command's (`OPTIONS`), else a registered job's."""
    return OPTIONS[command] if command in OPTIONS else job_options(JOBS[command])


def job_commands() -> list[str]:
    """The registered jobs that have no hand-written command, whose commands are made from them."""
    return [name for name in JOBS if name not in OPTIONS]


def added_options(command: str) -> list[Opt]:
    """The options of the settings added to `command` from outside (`register_setting`), in registered order."""
    return [_declared(name, one.type, one.default, one.setting) for name, one in added(command).items()]


def command_options(command: str) -> list[Opt]:
    """Every option of `command` as it is parsed and listed now: its declared ones, then those added to it."""
    return declared_options(command) + added_options(command)


def register_setting(name: str, default, type, group: str, help: str, *, command: str = "sweep",
                     fingerprint: bool = True, flag: str | None = None, metavar: str | None = None,
                     check: Callable[[Any], None] | None = None) -> AddedSetting:
    """Add the setting `name` to `command`'s config from outside the package, declared once here: its default, its
    `type` (as a field's annotation: ``int``, ``float``, ``str``, ``bool``, ``bool | None``, ``Literal[...]``,
    ``int | None``, ...), the `group` and `help` of its option (``--name-with-dashes`` unless `flag` says),
    whether it enters the fingerprint (by default it does: a sweep swept with another value never resumes or
    merges into this one), and `check`, which raises `headscan.errors.ConfigError` for a value it refuses.

    From then on the command takes it as an option (its --help lists it, docs/options.md as generated lists it),
    ``headscan.sweep(..., name=value)`` takes it as a keyword, and the config holds it: ``config.name`` (its value
    is kept in ``config.extra``), where the code that uses it (a pass of your own, `headscan.scan.passes`) reads it
    from the plan's config. Only ``sweep`` takes added settings. A name or flag already taken is refused; remove
    one with ``del headscan.setting.ADDED[command][name]`` (tests/test_added_setting.py adds one and removes it).
    """
    config = CONFIGS.get(command)
    if config is None or "extra" not in {f.name for f in dataclasses.fields(config)}:
        raise ConfigError(f"register_setting: command {command!r} takes no added settings; only sweep does")
    if not name.isidentifier() or name.startswith("_") or name != name.lower():
        raise ConfigError(f"register_setting: a setting needs a lower-case name of letters, digits and _, got {name!r}")
    taken = [opt.name for opt in command_options(command)] + [f.name for f in dataclasses.fields(config)]
    if name in taken:
        raise ConfigError(f"register_setting: {command} already has a setting or option named {name!r}; pick "
                          f"another name (taken: {', '.join(taken)})")
    try:
        one = AddedSetting(name, default, type, Setting(group, help, flag, metavar), command, fingerprint, check)
    except ValueError as error:  # a group that is none of GROUPS
        raise ConfigError(f"register_setting: {name}: {error}") from None
    try:
        opt = _declared(name, type, default, one.setting)
    except (KeyError, IndexError, TypeError):
        raise ConfigError(f"register_setting: {name}: the command line cannot parse type {type!r}; give it as a "
                          "field's annotation: int, float, str, bool, bool | None, Literal[...], int | None, "
                          "tuple[str, ...], tuple[int, ...]") from None
    flags = {spelling for o in command_options(command) for decl in (*o.decls[1:], *o.old)
             for spelling in decl.split("/")}
    if twice := sorted(flags & set(f for decl in opt.decls[1:] for f in decl.split("/"))):
        raise ConfigError(f"register_setting: {name}: {command} already has the flag {twice[0]}; pass flag=...")
    one.checked(default)
    ADDED.setdefault(command, {})[name] = one
    return one


def options(command: str):
    """A decorator adding the declared options of `command` (a key of `OPTIONS`, or a registered job), in order;
    those added from outside are added when the command is parsed (`GroupedCommand`)."""
    def decorate(function):
        for opt in reversed(declared_options(command)):  # click lists options in the reverse order of decoration
            function = opt(function)
        return function
    return decorate


def config_from(config: type, params: dict):
    """`config` (`SweepConfig`, `RetrievalConfig` or `PatchConfig`) from a command's parsed options, the settings
    added to its command included; ConfigError if refused."""
    extra = added(config.command)
    hints = get_type_hints(config) | {name: one.type for name, one in extra.items()}
    names = [*settings(config), *(name for name in extra if name in params)]
    return with_settings(config(), {name: TRISTATE[params[name]] if _tristate(hints[name]) else params[name]
                                    for name in names})


def flag_of(name: str) -> str:
    """The flag of a setting or option named `name` (``prepend_bos``: ``--bos``), for messages."""
    for opt in (opt for command in OPTIONS for opt in command_options(command)):
        if opt.name == name:
            return max((d.split("/")[0] for d in opt.decls[1:]), key=len)
    return "--" + name.replace("_", "-")


def shown_opts(parameter: click.Parameter) -> list[str]:
    """The spellings of `parameter` that --help lists (an old spelling kept working is not one)."""
    return [o for o in parameter.opts if o not in getattr(parameter, "old", ())]


class GroupedCommand(click.Command):
    """A command whose --help lists its options by group, one section each, in the order of `TITLES`, and which
    parses and lists the settings added to it from outside (`register_setting`) as options of its own."""

    _added: tuple = ((), [])  # (the added settings they were made for, their click options): made once per change

    def get_params(self, ctx):
        now = tuple(added(self.name).values())
        if self._added[0] != now:  # one set of options per registration, so click parses and processes the same ones
            self._added = (now, [opt.option() for opt in added_options(self.name)])
        params = super().get_params(ctx)
        return [*self.params, *self._added[1], *(p for p in params if p not in self.params)]

    def format_options(self, ctx, formatter):
        sections: dict[str, list] = {}
        for parameter in self.get_params(ctx):
            record = parameter.get_help_record(ctx)
            if record:
                sections.setdefault(getattr(parameter, "group", "other"), []).append(record)
        for group in sorted(sections, key=lambda g: list(TITLES).index(g) if g in TITLES else len(TITLES)):
            with formatter.section(f"{TITLES.get(group, 'Other')} options"):
                formatter.write_dl(sections[group])


def options_markdown() -> str:
    """docs/options.md: every command's options by group, as its --help lists them, from `OPTIONS` and the settings
    added from outside (`register_setting`) at the time."""
    lines = ["# Command-line options", "",
             "Every command's options by group, as `headscan COMMAND --help` lists them, and the Python function",
             "the command calls (`help(headscan.NAME)` says its arguments). Generated from the declarations in",
             "`headscan/config.py` and `headscan/cli_options.py` by `python -m headscan.cli_options`.",
             "A setting of your own, added with `headscan.register_setting`, is listed with its command's.",
             ""]
    for name in [*OPTIONS, *job_commands()]:  # the jobs registered at the time (from outside) after headscan's
        opts = command_options(name)
        python = ENTRY_POINTS[name] if name in ENTRY_POINTS else JOBS[name].python_name
        lines += [f"## headscan {name}", "", f"From Python: `headscan.{python}`, which the command calls.", ""]
        if not opts:
            lines += ["No options.", ""]
            continue
        function = lambda **_: None  # noqa: E731
        for opt in reversed(opts):  # click lists options in the reverse order of decoration
            function = opt(function)
        command = click.command(name)(function)
        context = click.Context(command, info_name=name)
        for group in [g for g in TITLES if any(o.group == g for o in opts)]:
            lines += [f"### {TITLES[group]}", ""]
            for parameter in (p for p in command.params if p.group == group):
                spec, text = parameter.get_help_record(context)
                lines.append(f"- `{spec}`: {text}")
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/options.md")
    path.write_text(options_markdown())
    print(f"wrote {path}")
