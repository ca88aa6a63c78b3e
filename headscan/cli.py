"""The `headscan` command line: parse options, call one library function, turn headscan errors into one line.

No work happens here: each command calls one public function, ``headscan.NAME`` (`entry_point`; the names are
`headscan.cli_options.ENTRY_POINTS`), with what it parsed, and prints what that returns. A registered job with no
command written here gets one made from it (`job_command`), which calls its ``headscan.NAME``.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path

import click

from .cli_options import ENTRY_POINTS, GroupedCommand, config_from, flag_of, job_commands, options, shown_opts
from .config import SweepConfig
from .errors import ConfigError, HeadscanError, SweepInterrupted
from .retrieval_config import RetrievalConfig
from .scan.jobs import JOBS
from .tables import TABLES

# What `headscan retrieval` and `headscan patch` write; a sweep fills the other tables of the registry.
RETRIEVAL_TABLES = ("retrieval", "retrieval_trials", "retrieval_masking", "retrieval_masking_trials")
PATCH_TABLES = ("patching", "paths")


def _one_line_errors(command):
    """Show a headscan error as one line (exit 1), never as a traceback; settings are named by their flag."""

    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except SweepInterrupted as error:
            message = str(error)
            if kwargs.get("restart") and "without --restart" not in message:  # it would discard what it just kept
                message = message.replace("run the same command again", "run the same command without --restart")
            click.echo(f"Interrupted: {message}", err=True)
            raise SystemExit(130) from None  # the shell's convention for a SIGINT
        except ConfigError as error:
            message = str(error)
            if error.setting and message.startswith(error.setting):
                message = flag_of(error.setting) + message[len(error.setting):]
            raise click.ClickException(message) from None
        except HeadscanError as error:
            raise click.ClickException(str(error)) from None

    return wrapper


def entry_point(command: str) -> Callable:
    """``headscan.NAME``, the function ``headscan COMMAND`` calls (imported on first use: most load torch)."""
    return getattr(sys.modules[__package__], ENTRY_POINTS[command])


def _effective_command(context: click.Context) -> str:
    """The command line with every option spelled out, defaults included, for provenance."""
    words = [context.command_path]
    for parameter in context.command.get_params(context):  # settings added from outside included
        if parameter.name == "help":
            continue
        flag, value = max(shown_opts(parameter), key=len), context.params.get(parameter.name)
        if isinstance(value, tuple) and parameter.nargs == 1 and not parameter.multiple:  # --lengths 1024,2048: one option
            value = ",".join(map(str, value)) if value else None
        for item in value if isinstance(value, tuple) else (value,):
            if item is False and getattr(parameter, "secondary_opts", None):  # --no-values: the off switch
                words.append(max(parameter.secondary_opts, key=len))
                continue
            if item is None or item is False or parameter.name == "quiet":
                continue
            if isinstance(parameter, click.Argument):
                words.append(shlex.quote(str(item)))
            else:
                words.append(flag if item is True else f"{flag} {shlex.quote(str(item))}")
    return " ".join(words)


class JobGroup(click.Group):
    """The command group, with a command made for each registered job that has no hand-written one
    (`headscan.scan.jobs`, `job_command`), so that a job registered from outside is ``headscan NAME`` too."""

    _made: dict = {}  # job -> its command, made once per registration

    def list_commands(self, ctx):
        return [*super().list_commands(ctx), *sorted(name for name in job_commands() if name not in self.commands)]

    def get_command(self, ctx, name):
        if name in self.commands or name not in JOBS:
            return super().get_command(ctx, name)
        job = JOBS[name]
        if job not in self._made:
            self._made[job] = job_command(job)
        return self._made[job]


def job_command(job) -> click.Command:
    """``headscan NAME`` of a registered job: its options (`headscan.cli_options.job_options`), and ``headscan.NAME``
    called with what they say."""

    def command(models, source, out, overwrite, restart, quiet, **settings):
        config = config_from(job.config, settings)
        result = getattr(sys.modules[__package__], job.python_name)(
            list(models), source, out, config, overwrite=overwrite, restart=restart, progress=not quiet,
            command=_effective_command(click.get_current_context()))
        files = ", ".join(f"{out}/{TABLES[name].file}" for name in result.frames)
        click.echo(f"wrote {files} and {out}/run.json")

    example = job.example or f"headscan {job.name} -m MODEL --input INPUT --out out/{job.name}"
    command.__doc__ = f"{job.help}\n\n{job.description}\n\nExample:\n\n\b\n    {example}\n".replace("\n\n\n\n", "\n\n")
    return click.command(job.name, cls=GroupedCommand, short_help=job.help)(options(job.name)(_one_line_errors(command)))


@click.group(cls=JobGroup)
@click.version_option(package_name="headscan")
def cli():
    """Score every attention head of hooked transformers into tidy parquet tables.

    Labels are 0-indexed L{layer}H{head}, as in TransformerLens: Clark et al.'s
    1-indexed BERT "head 3-1" is L2H0 here.
    """


def _table_list() -> str:
    """The tables a sweep fills, one line each, as its help lists them (kept as written: click's \\b)."""
    tables = [table for table in TABLES.values() if table.name not in RETRIEVAL_TABLES + PATCH_TABLES]
    width = max(len(table.file) for table in tables)
    # "one row per (model, layer, head, metric)": the description's opening, up to its key
    lines = [f"  {table.file:{width}} {table.description[:table.description.find(')') + 1]}" for table in tables]
    return "\b\n    " + "\n    ".join(lines)


def _listing_tables(command):
    """Put the registry's tables into `command`'s help, where its docstring says {tables}."""
    command.__doc__ = command.__doc__.replace("{tables}", _table_list())
    return command


@cli.command(cls=GroupedCommand, short_help="Score every head of every layer of each MODEL over a corpus.")
@options("sweep")
@_listing_tables
@_one_line_errors
def sweep(models, corpus, out, save_every, shard, overwrite, restart, ray, quiet, checkpoints, **settings):
    """Score every head of every layer of each MODEL over a corpus.

    Writes OUT/run.json (provenance) and a parquet file per table the sweep
    fills, then prints the top previous- and next-token heads:

    {tables}

    Stopped (Ctrl-C, SIGTERM, a killed job), it keeps what it did in OUT.partial/,
    as of the last end of a window of --window segments; the same command resumes
    from there, and the stop message says from which segment.

    Example:

    \b
        headscan sweep --model minilm --corpus en_ewt-ud-dev.conllu --out out/ewt
        headscan sweep --model gpt2 --corpus big.jsonl --out out/big --ray auto
        headscan sweep -m smollm2 -c en_ewt-ud-dev.conllu --pack sentences --max-len 2048 --attention chunked
        headscan sweep -m minilm -c en_ewt-ud-dev.conllu --control random-init --control shuffled-words
        headscan sweep -m smollm2 -c en_ewt-ud-dev.conllu --importance ablate --ablate-top 10 --importance-sample 256
        headscan sweep -m minilm -m smollm2 -c en_ewt-ud-dev.conllu --importance ablate --importance-model minilm
        headscan sweep -m minilm -m smollm2 -c en_ewt-ud-dev.conllu --similarity-sample 64
        headscan sweep -m smollm2 -c en_ewt-ud-dev.conllu --layers 0,5-7 --out out/some-layers
        headscan sweep --checkpoints runs/tiny -c repeat-random:n=25,count=32 --out out/tiny-series
        headscan sweep -m EleutherAI/pythia-70m@step3000 -m EleutherAI/pythia-70m@step143000 -c repeat-random
    """
    from .models import DEFAULT_MODELS
    from .scan.inputs import check_sweep

    config = config_from(SweepConfig, settings)
    command = _effective_command(click.get_current_context())
    if checkpoints is not None:
        from .models.series import checkpoint_series

        models = (*models, *checkpoint_series(checkpoints))
    models = list(models) or list(DEFAULT_MODELS)
    # every argument and path checked before torch is imported (the sweep checks them again, at no cost)
    check_sweep(models, corpus, out, config, overwrite=overwrite, save_every=save_every, shard=shard)

    result = entry_point("sweep")(models, corpus, out, config, shard=shard, overwrite=overwrite, restart=restart,
                                  progress=not quiet, command=command, save_every=save_every, ray=ray)

    from .analysis.claims import findings_note
    from .analysis.ranking import unit_note
    from .analysis.show import length_notes, top_heads_text

    click.echo(unit_note(result.provenance), err=True)
    for line in length_notes(result.provenance, config.long):
        click.echo(line, err=True)
    files = ", ".join(f"{out}/{TABLES[name].file}" for name in result.frames)
    click.echo(f"wrote {files} and {out}/run.json")
    if note := findings_note(result.provenance.extra.get("findings"), result.heads):
        click.echo(note)
    for metric in ("prev_token", "next_token") + (("importance",) if "importance" in result.frames else ()):
        click.echo(f"\ntop heads by {metric}:")
        click.echo(top_heads_text(result, metric, 3))


@cli.command(cls=GroupedCommand, short_help="Find retrieval heads by needle-in-a-haystack decoding.")
@options("retrieval")
@_one_line_errors
def retrieval(models, corpus, needles, out, overwrite, restart, quiet, **settings):
    """Find retrieval heads (Wu et al. 2024) by needle-in-a-haystack decoding.

    One trial per length, depth and needle: a needle sentence planted in a
    haystack cut from the corpus, a question, and a greedy answer decoded
    with chunked attention. A head copies at a step when its most-attended
    key is the needle token just generated; a trial scores copying steps
    over the answer's tokens. Writes OUT/retrieval.parquet (per head: the
    mean over trials whose answer passes the ROUGE-1 gate, and over all
    trials, with 95% intervals over trials), OUT/retrieval_trials.parquet
    (every trial, failed ones included) and OUT/run.json. Stopped, it keeps
    finished trials in OUT.partial/; the same command resumes.

    With --mask-top K and --mask-random K, the trials of the odd needles are
    decoded again with the top K retrieval heads of the even needles' trials
    masked (output zeroed at every position; --mask-from ranks them by a run
    on other needles instead), and with K random heads of the same layers in
    --mask-draws seeded draws (20): OUT/retrieval_masking.parquet has the
    needle accuracy (ROUGE-1 recall) per condition and depth, its paired drop
    from the unmasked trials with 95% intervals over needles, and the top
    drop's rank among the draws' (a permutation p-value).

    Example:

    \b
        headscan retrieval -m smollm2 --corpus en_ewt-ud-dev.conllu --lengths 1024,2048 --out out/retrieval
        headscan retrieval -m smollm2 --corpus en_ewt-ud-dev.conllu --lengths 1024 --mask-top 10 \\
            --mask-random 10 --out out/retrieval-mask
    """
    from .scan.inputs import check_retrieval

    config = config_from(RetrievalConfig, settings)
    command = _effective_command(click.get_current_context())
    check_retrieval(list(models), corpus, out, needles=needles, overwrite=overwrite)  # before torch is imported

    result = entry_point("retrieval")(list(models), corpus, out, config, needles=needles, overwrite=overwrite,
                                      restart=restart, progress=not quiet, command=command)

    from .analysis.whole_context import retrieval_summary

    files = ", ".join(f"{out}/{TABLES[name].file}" for name in RETRIEVAL_TABLES if name in result.frames)
    click.echo(f"wrote {files} and {out}/run.json")
    click.echo(retrieval_summary(result))


@cli.command(cls=GroupedCommand, short_help="Patch every head (and paths between heads) between prompt pairs.")
@options("patch")
@_one_line_errors
def patch(models, pairs, select_pairs, out, overwrite, restart, quiet, **settings):
    """Contrastive activation patching: each head's output moved between the
    clean and corrupted prompts of PAIRS, read as the logit difference between
    the answer and the wrong answer at the last token. Writes
    OUT/patching.parquet (per head: denoising, noising and their AtP
    estimates, as the fraction of the difference restored and in logits, with
    95% intervals over pairs), OUT/paths.parquet (with --path-top or --paths:
    a sender's effect through a receiver's queries, keys or values) and
    OUT/run.json. Path candidates are chosen on other pairs than those their
    paths are estimated on (--select-pairs, or half of PAIRS). Stopped, it
    keeps finished steps in OUT.partial/; the same command resumes.

    Example:

    \b
        headscan pairs ioi --n 64 -m smollm2 --out pairs.jsonl
        headscan patch -m smollm2 --pairs pairs.jsonl --path-top 4 --out out/patch
    """
    from .patching_config import PatchConfig

    config = config_from(PatchConfig, settings)
    result = entry_point("patch")(list(models), pairs, out, config, select_pairs=select_pairs, overwrite=overwrite,
                                  restart=restart, progress=not quiet,
                                  command=_effective_command(click.get_current_context()))

    from .analysis.patching import patching_summary
    click.echo(f"wrote {result.path}")
    click.echo(patching_summary(result))


@cli.command(cls=GroupedCommand, short_help="Write prompt pairs for headscan patch from word lists (ioi, induction, "
             "capitals).")
@click.argument("kind", type=click.Choice(["ioi", "induction", "capitals"]))
@options("pairs")
@_one_line_errors
def pairs(kind, n, seed, model, out, overwrite):
    """Write N seeded prompt pairs of KIND into OUT (JSON lines): ioi (Wang et
    al.'s indirect object task, ABC corruption), induction (a repeated run of
    words, corrupted where the repeat continues from) or capitals (factual
    recall). With --model, only words that are one token for it are used.

    Example:

    \b
        headscan pairs ioi --n 64 -m smollm2 --out pairs.jsonl
    """
    path = entry_point("pairs")(kind, n, out, seed=seed, model=model, overwrite=overwrite)
    click.echo(f"wrote {n} {kind} pairs to {path}")


@cli.command(cls=GroupedCommand, short_help="Merge the shards of a sweep, or sweeps of disjoint layers, into one run's tables.")
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@options("merge")
@_one_line_errors
def merge(shards, out, overwrite):
    """Merge the outputs of the N shards of one sweep into the unsharded tables,
    and sweeps of disjoint layers of a model (--layers) into the whole model's.

    Values, sums, counts and 95% intervals are those of one sweep over the
    whole corpus and every layer given; findings are tested again over the
    merged tables. Refuses a missing or repeated shard, two runs that sweep
    the same layer, and outputs of different sweeps (naming what differs).

    Example:

    \b
        headscan merge out/part-0 out/part-1 out/part-2 out/part-3 --out out/all
        headscan merge out/layers-0-5 out/layers-6-11 --out out/all
    """
    command = _effective_command(click.get_current_context())
    entry_point("merge")(list(shards), out, overwrite=overwrite, command=command)
    click.echo(f"merged {len(shards)} runs into {out}")


@cli.command(cls=GroupedCommand, short_help="Write a run as a Hugging Face dataset folder, one config per table.")
@click.argument("run", type=click.Path(path_type=Path))
@options("export")
@_one_line_errors
def export(run, out, overwrite):
    """Write a sweep (or retrieval) output as a dataset folder that datasets.load_dataset reads, one config per
    table (data/TABLE.parquet), with run.json and a dataset card (README.md), ready for huggingface-cli upload.

    Example:

    \b
        headscan export out/ewt --out out/ewt-dataset
    """
    folder = entry_point("export")(run, out, overwrite=overwrite)
    click.echo(f"wrote {folder}: load it with datasets.load_dataset({str(folder)!r}, 'heads')")


@cli.command("import-scores", cls=GroupedCommand,
             short_help="Read a published retrieval-head score file (Retrieval_Head's JSON) as a retrieval run.")
@click.argument("scores", type=click.Path(path_type=Path))
@options("import-scores")
@_one_line_errors
def import_scores(scores, out, model, seed, bootstrap, interval, overwrite):
    """Read SCORES, a Retrieval_Head head_score/MODEL.json ({"layer-head": [score of each trial]}), into OUT as the
    retrieval.parquet of a retrieval run, intervals bootstrapped over its trials; headscan report shows it beside
    your own runs, trial counts side by side.

    Example:

    \b
        headscan import-scores head_score/llama-2-7b-80k.json --out out/llama-published
        headscan report out/ewt out/retrieval out/llama-published --out out/report
    """
    run = entry_point("import-scores")(scores, out, model=model, seed=seed, bootstrap=bootstrap, interval=interval,
                         overwrite=overwrite, command=_effective_command(click.get_current_context()))
    part = run["retrieval"]
    top = part.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable").head(5)
    click.echo(f"{run.models[0]}: {len(part)} heads, {int(part['count'].max())} trials each; top: "
               + ", ".join(f"{r.label} {r.value:.2f}" for r in top.itertuples()))
    click.echo(f"wrote {run.path}")


@cli.command(cls=GroupedCommand, short_help="List the embedded models, or say how each SPEC would be hooked.")
@click.argument("specs", nargs=-1, metavar="[SPEC]...")
@options("models")
@_one_line_errors
def models(specs):
    """List the embedded offline models, or say how each SPEC would be hooked.

    With no SPEC: the embedded aliases and whether each is installed, and the
    controls a sweep can add. With SPECs (aliases, checkpoint folders, .gguf
    files, cached Hugging Face ids, or a control of one: 'minilm [random
    init]'): each one's architecture and the path its attention patterns are
    read through (transformer_lens, or hf_hooks on the model's own attention
    modules), read from its config without loading the weights.

    Example:

    \b
        headscan models minilm path/to/distilbert
    """
    click.echo(entry_point("models")(specs))


@cli.command(cls=GroupedCommand, short_help="Print the top heads of a run for one metric, per model.")
@click.argument("run", type=click.Path(path_type=Path))
@options("show")
@_one_line_errors
def show(run, metric, top):
    """Print the top heads of a sweep (or retrieval) output for one metric, per model, with each head's
    interval, chance (uniform attention's value on the same queries) and why it carries no claim ("at chance",
    "thin support"); control models, such as 'minilm [random init]', after theirs and named as such; and which
    unit the 95% intervals resampled.

    A profile prints each head at its peak (offsets: the offset each head
    attends to most, the most focused heads first). --metric syntax prints
    each relation's best head against the fixed-offset baseline (a sweep of
    a CoNLL-U treebank); --metric importance the heads whose removal changes
    the model's loss most (a sweep with --importance). A metric whose table
    the run lacks is refused, saying how to get it.

    Example:

    \b
        headscan show out --metric next_token --top 5
        headscan show out --metric offsets
    """
    from .tables import load

    tables = load(run)  # a missing or damaged run is refused before the metrics (and torch) are imported
    click.echo(entry_point("show")(tables, metric, top))


@cli.command(cls=GroupedCommand, short_help="Render runs into figures, report.md and an index.html head atlas.")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@options("report")
@_one_line_errors
def report(runs, out, top, example, no_models, quiet, overwrite):
    """Render one or more sweep outputs into figures, report.md and a self-contained index.html with the
    head atlas.

    Unless --no-models, each model is loaded once (on the CPU) to compute every head's attention on the
    --example sentence (and, for repeated-token runs, on a repeated sequence); a model that cannot be loaded
    is named, with why, and the rest is drawn. Progress goes to stderr.

    Example:

    \b
        headscan report out --out reports/demo
    """
    from .tables import load

    loaded = [load(run) for run in runs]  # a missing or damaged run is refused before the report (and torch) loads

    def progress(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    folder = entry_point("report")(loaded, out, top=top, models=not no_models, example=example, progress=progress,
                                   failed=lambda line: click.echo(line, err=True), overwrite=overwrite)
    click.echo(f"wrote {folder}/index.html and {folder}/report.md")
