"""The `headscan` command line: parse options, call one library function, turn headscan errors into one line.

No work happens here: see `headscan.scan`, `headscan.tables` and `headscan.report`.
"""

from __future__ import annotations

import shlex
from functools import wraps
from pathlib import Path

import click

from .config import SweepConfig, choices, default
from .errors import ConfigError, HeadscanError

# Settings whose flag is not --the-setting-name.
_FLAGS = {"models": "--model", "prepend_bos": "--bos"}


def _flag(setting: str) -> str:
    return _FLAGS.get(setting, "--" + setting.replace("_", "-"))


def _one_line_errors(command):
    """Show a headscan error as one line (exit 1), never as a traceback; settings are named by their flag."""

    @wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except ConfigError as error:
            message = str(error)
            if error.setting and message.startswith(error.setting):
                message = _flag(error.setting) + message[len(error.setting):]
            raise click.ClickException(message) from None
        except HeadscanError as error:
            raise click.ClickException(str(error)) from None

    return wrapper


def _effective_command(context: click.Context) -> str:
    """The command line with every option spelled out, defaults included, for provenance."""
    words = [context.command_path]
    for parameter in context.command.params:
        flag, value = max(parameter.opts, key=len), context.params.get(parameter.name)
        for item in value if isinstance(value, tuple) else (value,):
            if item is None or item is False or parameter.name == "quiet":
                continue
            words.append(flag if item is True else f"{flag} {shlex.quote(str(item))}")
    return " ".join(words)


_BOS = {"auto": None, "yes": True, "no": False}  # --bos -> SweepConfig.prepend_bos


@click.group()
@click.version_option(package_name="headscan")
def cli():
    """Score every attention head of hooked transformers into tidy parquet tables.

    Labels are 0-indexed L{layer}H{head}, as in TransformerLens: Clark et al.'s
    1-indexed BERT "head 3-1" is L2H0 here.
    """


@cli.command()
@click.option("models", "--model", "-m", multiple=True, metavar="SPEC",
              help="Alias (minilm, smollm2), local checkpoint folder, .gguf file or Hugging Face id; repeat for "
                   "several models. Default: minilm and smollm2.")
@click.option("--corpus", "-c", default="builtin", show_default=True, metavar="PATH|builtin|repeat-random",
              help="A .txt (one segment per line), .jsonl (a 'text' field) or .conllu file, 'builtin', or "
                   "'repeat-random[:n=50,count=64,seed=0]'.")
@click.option("--out", "-o", default="out", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for heads.parquet, offsets.parquet and run.json.")
@click.option("--max-len", default=default("max_len"), show_default=True, help="Tokens per segment; longer ones are truncated.")
@click.option("--batch-size", default=default("batch_size"), show_default=True,
              help="Segments per forward pass (scores do not depend on it).")
@click.option("--limit", type=int, default=default("limit"), help="Read at most this many segments.")
@click.option("--device", default=default("device"), show_default=True, type=click.Choice(choices()["device"]))
@click.option("--dtype", default=default("dtype"), show_default=True, type=click.Choice(choices()["dtype"]))
@click.option("--specials", default=default("specials"), show_default=True, type=click.Choice(choices()["specials"]),
              help="'exclude': special tokens ([CLS], [SEP], BOS) count neither as queries nor keys, and each "
                   "query's attention is renormalised over the keys left.")
@click.option("--bos", type=click.Choice(list(_BOS)), default="auto", show_default=True,
              help="Causal models: put BOS before each segment ('auto' follows TransformerLens' default).")
@click.option("--max-offset", default=default("max_offset"), show_default=True, help="K of the offset profile (offsets -K..K).")
@click.option("--bootstrap", default=default("bootstrap"), show_default=True,
              help="Bootstrap replicates for the 95% intervals (0: none; else at least 20).")
@click.option("--seed", default=default("seed"), show_default=True, help="Seed of the bootstrap.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_one_line_errors
def sweep(models, corpus, out, max_len, batch_size, limit, device, dtype, specials, bos, max_offset, bootstrap, seed, quiet):
    """Score every head of every layer of each MODEL over a corpus.

    Writes OUT/heads.parquet (one row per model, layer, head and metric),
    OUT/offsets.parquet (one row per model, layer, head and offset) and
    OUT/run.json (provenance), then prints the top previous- and next-token heads.

    Example:

        headscan sweep --model minilm --corpus en_ewt-ud-dev.conllu --out out/ewt
    """
    from . import tables
    from .models import DEFAULT_MODELS
    from .scan import sweep as run_sweep

    config = SweepConfig(
        max_len=max_len, batch_size=batch_size, limit=limit, device=device, dtype=dtype, specials=specials,
        max_offset=max_offset, bootstrap=bootstrap, seed=seed, prepend_bos=_BOS[bos],
    )
    command = _effective_command(click.get_current_context())
    result = run_sweep(list(models) or DEFAULT_MODELS, corpus, out, config, progress=not quiet, command=command)
    files = ", ".join(f"{out}/{tables.TABLES[name].file}" for name in result.frames)
    click.echo(f"wrote {files} and {out}/run.json")
    for metric in ("prev_token", "next_token"):
        click.echo(f"\ntop heads by {metric}:")
        click.echo(tables.top_heads(result.heads, metric, 3).to_string(index=False))


@cli.command()
@_one_line_errors
def models():
    """List the embedded offline models and whether each is installed.

    Example:

        headscan models
    """
    from .models import ALIASES, alias_status

    for name, path in alias_status().items():
        alias = ALIASES[name]
        state = f"installed: {path}" if path else f"not installed ({alias.install})"
        click.echo(f"{name:8} {alias.description}\n         {state}")


@cli.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--metric", default="prev_token", show_default=True, help="Metric to rank heads by.")
@click.option("--top", default=10, show_default=True, help="How many heads per model.")
@_one_line_errors
def show(run, metric, top):
    """Print the top heads of a sweep output for one metric, per model.

    Example:

        headscan show out --metric next_token --top 5
    """
    from . import tables

    loaded = tables.load(run)
    click.echo(tables.top_heads(loaded.heads, metric, top).to_string(index=False))


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report folder (default: reports/<run name>).")
@click.option("--top", default=10, show_default=True, help="Top heads listed per metric.")
@click.option("--example", default=None, help="Sentence whose attention is drawn for the strongest heads.")
@click.option("--no-models", is_flag=True, help="Draw only what needs the tables, without loading the models.")
@_one_line_errors
def report(runs, out, top, example, no_models):
    """Render one or more sweep outputs into figures, report.md and a self-contained index.html.

    Example:

        headscan report out --out reports/demo
    """
    from .report import write_report

    folder = write_report(list(runs), out, top=top, example=example, load_models=not no_models)
    click.echo(f"wrote {folder}/index.html and {folder}/report.md")
