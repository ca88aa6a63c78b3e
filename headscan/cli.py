"""The `headscan` command line: parse options, call one library function, turn headscan errors into one line.

No work happens here: see `headscan.scan`, `headscan.tables`, `headscan.analysis` and `headscan.report`.
"""

from __future__ import annotations

import shlex
from functools import wraps
from pathlib import Path

import click

from .config import CONTROLS, RetrievalConfig, SweepConfig, choices, default
from .errors import ConfigError, HeadscanError, SweepInterrupted
from .tables import TABLES

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
        except SweepInterrupted as error:
            click.echo(f"Interrupted: {error}", err=True)
            raise SystemExit(130) from None  # the shell's convention for a SIGINT
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


_BOS = {"auto": None, "yes": True, "no": False}  # --bos -> SweepConfig.prepend_bos
CONTROL_WHAT = {"random-init": "a control with untrained weights drawn from the config's initialiser: ",
                "shuffled-words": "the model, as a control swept over each segment's words permuted: "}


@click.group()
@click.version_option(package_name="headscan")
def cli():
    """Score every attention head of hooked transformers into tidy parquet tables.

    Labels are 0-indexed L{layer}H{head}, as in TransformerLens: Clark et al.'s
    1-indexed BERT "head 3-1" is L2H0 here.
    """


def _table_list() -> str:
    """The registry's tables, one line each, as the sweep's help lists them (kept as written: click's \\b)."""
    lines = [f"  {table.file:18} {table.description.split(': ')[0]}" for table in TABLES.values()]
    return "\b\n    " + "\n    ".join(lines)


def _listing_tables(command):
    """Put the registry's tables into `command`'s help, where its docstring says {tables}."""
    command.__doc__ = command.__doc__.replace("{tables}", _table_list())
    return command


def _device_options(device: str, dtype: str):
    """--device and --dtype, declared once for every command that loads a model."""
    def decorate(command):
        command = click.option("--dtype", default=dtype, show_default=True, type=click.Choice(choices()["dtype"]),
                               help="Weights and activations (scores and sums stay float32 or float64).")(command)
        return click.option("--device", default=device, show_default=True, type=click.Choice(choices()["device"]),
                            help="Where the model runs: auto takes a GPU (cuda, then mps) where torch sees one.")(command)
    return decorate

@cli.command()
@click.option("models", "--model", "-m", multiple=True, metavar="SPEC",
              help="Alias (minilm, smollm2), local checkpoint folder, .gguf file or Hugging Face id; repeat for "
                   "several models. Default: minilm and smollm2.")
@click.option("--corpus", "-c", default="builtin", show_default=True, metavar="PATH|builtin|repeat-random|hf:NAME",
              help="A .txt (one segment per line), .jsonl (a 'text' field) or .conllu file, 'builtin', "
                   "'repeat-random[:n=50,count=64,seed=0]', or a Hugging Face dataset, one segment per row: "
                   "'hf:NAME[:config=...,split=train,field=text,revision=...]' (a save_to_disk folder, a folder of "
                   "data files, or a Hub id).")
@click.option("--out", "-o", default="out", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the tables (a parquet file each) and run.json.")
@click.option("--max-len", default=default("max_len"), show_default=True, help="Tokens per segment; longer ones are truncated.")
@click.option("--long", default=default("long"), show_default=True, type=click.Choice(choices()["long"]),
              help="A segment longer than --max-len: 'truncate' cuts it, 'split' feeds it as consecutive windows "
                   "of --max-len tokens, each with the model's special tokens.")
@click.option("--batch-size", default=default("batch_size"), show_default=True,
              help="Segments per forward pass (scores do not depend on it).")
@click.option("--limit", type=int, default=default("limit"), help="Read at most this many segments.")
@_device_options(default("device"), default("dtype"))
@click.option("--device-map", default=default("device_map"), metavar="MAP",
              help="Spread a model too large for one device over several: a Hugging Face device map name such as "
                   "'auto' (needs accelerate; replaces --device for the model's layers).")
@click.option("--specials", default=default("specials"), show_default=True, type=click.Choice(choices()["specials"]),
              help="'exclude': special tokens ([CLS], [SEP], BOS) count neither as queries nor keys, and each "
                   "query's attention is renormalised over the keys left.")
@click.option("--bos", type=click.Choice(list(_BOS)), default="auto", show_default=True,
              help="Causal models: put BOS before each segment ('auto' follows TransformerLens' default).")
@click.option("--max-offset", default=default("max_offset"), show_default=True, help="K of the offset profile (offsets -K..K).")
@click.option("--bootstrap", default=default("bootstrap"), show_default=True,
              help="Bootstrap replicates for the 95% intervals (0: none; else at least 20).")
@click.option("--seed", default=default("seed"), show_default=True, help="Seed of the bootstrap.")
@click.option("--bootstrap-unit", default=default("bootstrap_unit"), show_default=True,
              type=click.Choice(choices()["bootstrap_unit"]),
              help="What the bootstrap resamples: segments, or whole documents (CoNLL-U '# newdoc', a JSONL "
                   "--document-field, blank-line paragraphs), whose sentences are not independent; 'auto': "
                   "documents where the corpus has documents of several segments, else segments.")
@click.option("--document-field", default=default("document_field"), metavar="FIELD",
              help="A .jsonl or hf: corpus: the field whose value marks each line's document (consecutive lines with "
                   "equal values are one document; rows of an hf: corpus alike).")
@click.option("--interval", default=default("interval"), show_default=True, type=click.Choice(choices()["interval"]),
              help="How bootstrap replicates become a 95% interval.")
@click.option("--window", default=default("window"), show_default=True,
              help="Segments added up per window: the unit of resuming (state is saved at window ends).")
@click.option("--pack", default=default("pack"), show_default=True, type=click.Choice(choices()["pack"]),
              help="Long inputs: 'sentences' joins consecutive segments until each holds --max-len words (so it "
                   "fills --max-len tokens); 'documents' makes each document one segment (use --long split).")
@click.option("--attention", default=default("attention"), show_default=True,
              type=click.Choice(choices()["attention"]),
              help="'eager' reads each layer's attention pattern from the model; 'chunked' lets the model run its "
                   "fast attention and recomputes the pattern from queries and keys, --query-chunk rows at a time "
                   "(long contexts); 'auto' goes chunked once one layer's patterns pass 32 MiB or would pass "
                   "--attention-budget.")
@click.option("--query-chunk", type=int, default=default("query_chunk"),
              help="Queries per block in chunked mode (scores do not depend on it). Default: as many as keep a "
                   "block within 8 MiB, at least 64.")
@click.option("--attention-budget", type=int, default=default("attention_budget"), metavar="MIB",
              help="Memory one layer's eager attention (its patterns and the metrics' temporaries) may take before "
                   "--attention auto goes chunked (default: by device).")
@click.option("--values/--no-values", default=default("values"), show_default=True,
              help="Also score every head on value-weighted attention (value.parquet) and, for causal models, its "
                   "direct logit attribution (dla), in the same pass; --no-values leaves both out.")
@click.option("--control", multiple=True, type=click.Choice(CONTROLS),
              help="Also sweep a control beside each model, as a model of its own: 'random-init' (the same "
                   "architecture and tokenizer, weights drawn from its config's initialiser; named 'MODEL [random "
                   "init]') or 'shuffled-words' (the model over the corpus with each segment's words permuted; "
                   "'MODEL [shuffled words]'). Repeat for both; each doubles the sweep's time.")
@click.option("--control-seed", type=int, default=default("control_seed"), metavar="SEED",
              help="Seed of the controls' weights and word orders (default: --seed).")
@click.option("--importance", default=default("importance"), show_default=True,
              type=click.Choice(choices()["importance"]),
              help="Does each head matter (importance.parquet): 'atp' estimates, for every head, the change of the "
                   "model's loss when its output is replaced by its mean or by 0, from one backward pass per batch; "
                   "'ablate' also replaces each head's output exactly, one head at a time (slow: two passes per head).")
@click.option("--ablate-top", type=int, default=default("ablate_top"), metavar="N",
              help="With --importance ablate: only the N heads of largest |AtP| (on the importance sample).")
@click.option("--importance-sample", type=int, default=default("importance_sample"), metavar="N",
              help="Measure importance on a seeded sample of N segments (default: all); each head's mean output "
                   "comes from the same sample. The other tables still cover the whole corpus.")
@click.option("--mask-rate", default=default("mask_rate"), show_default=True,
              help="Encoders with a trained masked-LM head: share of tokens masked for the importance target "
                   "(80% [MASK], 10% random, 10% kept, seeded per segment).")
@click.option("--similarity-sample", type=int, default=default("similarity_sample"), metavar="N",
              help="Head families (similarity.parquet): the mean Jensen-Shannon divergence between every pair of heads' "
                   "attention over the queries of a seeded sample of N segments (Clark et al. 2019; default: off).")
@click.option("--sink", default=default("sink"), show_default=True,
              help="streaming: the first tokens a sink-and-window cache keeps (DuoAttention's deployment value).")
@click.option("--recent", default=default("recent"), show_default=True,
              help="streaming: the last tokens it keeps, the query's own included (DuoAttention's recent window).")
@click.option("--save-every", default=120.0, show_default=True, metavar="SECONDS",
              help="Save the partial state at the first window end after this many seconds.")
@click.option("--shard", default=None, metavar="K/N",
              help="Sweep only the K-th of N disjoint parts of the corpus (K from 0); combine with `headscan merge`.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it already holds a headscan run (its run.json).")
@click.option("--restart", is_flag=True, help="Discard the partial state of an earlier, stopped sweep into OUT "
                                               "instead of resuming from it.")
@click.option("--ray", is_flag=False, flag_value=True, default=None, type=click.UNPROCESSED, metavar="[ADDRESS]",
              help="Run on a Ray cluster, as many workers as its nodes' memory holds: --ray alone starts or uses a local instance; "
                   "--ray auto, --ray HOST:6379 or --ray ray://HOST:10001 connect to one (pip install 'headscan[ray]').")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--checkpoints", default=None, type=click.Path(path_type=Path), metavar="FOLDER",
              help="Also sweep every checkpoint folder inside FOLDER (save_pretrained folders named step1000, "
                   "step-1000, step_1000 or checkpoint-1000), in order of step; each model's provenance records "
                   "its step.")
@_listing_tables
@_one_line_errors
def sweep(models, corpus, out, max_len, long, batch_size, limit, device, dtype, device_map, specials, bos, max_offset, bootstrap, seed,
          bootstrap_unit, document_field, interval, window, pack, attention, query_chunk, attention_budget, values,
          control, control_seed, importance, ablate_top, importance_sample, mask_rate, sink, recent, save_every, shard,
          overwrite, restart, ray, quiet, similarity_sample, checkpoints):
    """Score every head of every layer of each MODEL over a corpus.

    Writes OUT/run.json (provenance) and a parquet file per table the sweep
    fills, then prints the top previous- and next-token heads:

    {tables}

    Stopped (Ctrl-C, SIGTERM, a killed job), it keeps what it did in OUT.partial/;
    the same command resumes from there.

    Example:

    \b
        headscan sweep --model minilm --corpus en_ewt-ud-dev.conllu --out out/ewt
        headscan sweep --model gpt2 --corpus big.jsonl --out out/big --ray auto
        headscan sweep -m smollm2 -c en_ewt-ud-dev.conllu --pack sentences --max-len 2048 --attention chunked
        headscan sweep -m minilm -c en_ewt-ud-dev.conllu --control random-init --control shuffled-words
        headscan sweep -m smollm2 -c en_ewt-ud-dev.conllu --importance ablate --ablate-top 10 --importance-sample 256
        headscan sweep -m minilm -m smollm2 -c en_ewt-ud-dev.conllu --similarity-sample 64
        headscan sweep --checkpoints runs/tiny -c repeat-random:n=25,count=32 --out out/tiny-series
        headscan sweep -m EleutherAI/pythia-70m@step3000 -m EleutherAI/pythia-70m@step143000 -c repeat-random
    """
    from .analysis.ranking import top_heads_text, unit_note
    from .scan import sweep as run_sweep
    from .models import DEFAULT_MODELS

    config = SweepConfig(
        max_len=max_len, long=long, batch_size=batch_size, limit=limit, device=device, dtype=dtype,
        device_map=device_map, specials=specials,
        max_offset=max_offset, bootstrap=bootstrap, seed=seed, prepend_bos=_BOS[bos], bootstrap_unit=bootstrap_unit,
        interval=interval, window=window, pack=pack, attention=attention, query_chunk=query_chunk,
        attention_budget=attention_budget, values=values, document_field=document_field, control=control,
        control_seed=control_seed, importance=importance, ablate_top=ablate_top,
        importance_sample=importance_sample, mask_rate=mask_rate,
        sink=sink, recent=recent, similarity_sample=similarity_sample,
    )
    command = _effective_command(click.get_current_context())
    if checkpoints is not None:
        from .models.series import checkpoint_series

        models = (*models, *checkpoint_series(checkpoints))
    result = run_sweep(list(models) or DEFAULT_MODELS, corpus, out, config, shard=shard, overwrite=overwrite,
                       restart=restart, progress=not quiet, command=command, save_every=save_every, ray=ray)
    click.echo(unit_note(result.provenance), err=True)
    for model in result.provenance.models:
        if model.max_len_note:
            click.echo(model.max_len_note, err=True)
        if model.n_truncated and config.long == "split":
            click.echo(f"{model.name}: {model.n_truncated:,} of {model.n_segments:,} segments were longer than "
                       f"--max-len {model.max_len} and were split into windows", err=True)
        elif model.n_truncated:
            click.echo(f"{model.name}: {model.n_truncated:,} of {model.n_segments:,} segments were longer than "
                       f"--max-len {model.max_len} and were cut ({model.n_tokens_lost:,} tokens lost; "
                       f"--long split keeps them)", err=True)
    files = ", ".join(f"{out}/{TABLES[name].file}" for name in result.frames)
    click.echo(f"wrote {files} and {out}/run.json")
    for metric in ("prev_token", "next_token") + (("importance",) if "importance" in result.frames else ()):
        click.echo(f"\ntop heads by {metric}:")
        click.echo(top_heads_text(result, metric, 3))


def _numbers(kind, setting: str):
    """A click callback: "1024,2048" to a tuple of `kind`, or a ConfigError naming the setting."""
    def parse(context, parameter, value):
        try:
            return tuple(kind(part) for part in str(value).split(",") if part.strip())
        except ValueError:
            raise click.BadParameter(f"{setting} must be numbers separated by commas, got {value!r}") from None
    return parse


_RETRIEVAL = RetrievalConfig()


@cli.command(short_help="Find retrieval heads by needle-in-a-haystack decoding (Wu et al. 2024).")
@click.option("models", "--model", "-m", multiple=True, required=True, metavar="SPEC",
              help="A causal model: alias (smollm2), local checkpoint folder, .gguf file or Hugging Face id; repeat "
                   "for several.")
@click.option("--haystack", "-c", required=True, metavar="PATH|builtin",
              help="The corpus the haystacks are cut from: any corpus headscan sweeps (.txt, .jsonl, .conllu).")
@click.option("--needles", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help='JSONL of {"needle", "question", "answer"} (default: headscan\'s own, invented facts).')
@click.option("--out", "-o", default="out/retrieval", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Folder for the tables and run.json.")
@click.option("--lengths", default=",".join(map(str, _RETRIEVAL.lengths)), show_default=True, metavar="N,N",
              callback=_numbers(int, "lengths"), help="Prompt lengths in tokens (template and question included).")
@click.option("--depths", default=",".join(f"{d:g}" for d in _RETRIEVAL.depths), show_default=True, metavar="D,D",
              callback=_numbers(float, "depths"), help="Needle depths: 0 opens the haystack, 1 closes it.")
@click.option("--template", default=_RETRIEVAL.template, show_default=True,
              type=click.Choice(choices(RetrievalConfig)["template"]),
              help="'raw': haystack then question (Wu et al. on base models); 'chat': the tokenizer's chat template.")
@click.option("--max-new-tokens", default=_RETRIEVAL.max_new_tokens, show_default=True, help="Greedy steps at most.")
@click.option("--gate", default=_RETRIEVAL.gate, show_default=True,
              help="A trial counts when the answer's ROUGE-1 recall is above this.")
@click.option("--seed", default=_RETRIEVAL.seed, show_default=True, help="Seed of the haystacks' starts and the bootstrap.")
@click.option("--bootstrap", default=_RETRIEVAL.bootstrap, show_default=True,
              help="Bootstrap replicates over trials for the 95% intervals (0: none; else at least 20).")
@click.option("--interval", default=_RETRIEVAL.interval, show_default=True, type=click.Choice(choices()["interval"]),
              help="How bootstrap replicates become a 95% interval.")
@_device_options(_RETRIEVAL.device, _RETRIEVAL.dtype)
@click.option("--bos", type=click.Choice(list(_BOS)), default="auto", show_default=True,
              help="Raw template: put BOS before the prompt ('auto' follows the model's sweep default).")
@click.option("--query-chunk", default=_RETRIEVAL.query_chunk, show_default=True,
              help="Queries per block of the chunked prefill (scores do not depend on it).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it already holds a headscan run (its run.json).")
@click.option("--restart", is_flag=True, help="Discard the trials a stopped run kept in OUT.partial/.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@_one_line_errors
def retrieval(models, haystack, needles, out, lengths, depths, template, max_new_tokens, gate, seed, bootstrap, interval,
              device, dtype, bos, query_chunk, overwrite, restart, quiet):
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

    Example:

    \b
        headscan retrieval -m smollm2 --haystack en_ewt-ud-dev.conllu --lengths 1024,2048 --out out/retrieval
    """
    from .analysis.whole_context import retrieval_summary
    from .scan import retrieval as run_retrieval

    config = RetrievalConfig(lengths=lengths, depths=depths, template=template, max_new_tokens=max_new_tokens, gate=gate,
                             seed=seed, bootstrap=bootstrap, interval=interval, device=device, dtype=dtype,
                             prepend_bos=_BOS[bos], query_chunk=query_chunk)
    command = _effective_command(click.get_current_context())
    result = run_retrieval(list(models), haystack, out, config, needles=needles, overwrite=overwrite, restart=restart,
                           progress=not quiet, command=command)
    click.echo(f"wrote {out}/retrieval.parquet, {out}/retrieval_trials.parquet and {out}/run.json")
    click.echo(retrieval_summary(result))


@cli.command()
@click.argument("shards", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the merged tables.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it already holds a headscan run (its run.json).")
@_one_line_errors
def merge(shards, out, overwrite):
    """Merge the outputs of the N shards of one sweep into the unsharded tables.

    Values, sums, counts and 95% intervals are those of one sweep over the
    whole corpus. Refuses a missing or repeated shard, and outputs of
    different sweeps (naming what differs).

    Example:

    \b
        headscan merge out/part-0 out/part-1 out/part-2 out/part-3 --out out/all
    """
    from .scan import merge as run_merge

    command = _effective_command(click.get_current_context())
    run_merge(list(shards), out, overwrite=overwrite, command=command)
    click.echo(f"merged {len(shards)} shards into {out}")


@cli.command()
@click.argument("specs", nargs=-1, metavar="[SPEC]...")
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
    from .models import ALIASES, alias_status, describe_spec

    if not specs:
        for name, path in alias_status().items():
            alias = ALIASES[name]
            state = f"installed: {path}" if path else f"not installed ({alias.install})"
            click.echo(f"{name:8} {alias.description}\n         {state}")
        click.echo("controls: sweep --control random-init adds 'MODEL [random init]' (its architecture and tokenizer, "
                   "untrained weights), --control shuffled-words 'MODEL [shuffled words]' (the model over the corpus "
                   "with each segment's words permuted)")
        return
    for spec in specs:
        found = describe_spec(spec)
        what = CONTROL_WHAT.get(found["control"], "")
        click.echo(f"{spec}: {what}{found['architecture']} ({found['model_type']}), hooked through {found['path']}")


@cli.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--metric", default=None, metavar="NAME",
              help="What to rank heads by: a metric of heads.parquet or value.parquet, a profile (offsets, "
                   "first_token_by_position, distance_by_position), copying, syntax, importance, retrieval or "
                   "retrieval_ungated (default: prev_token for a sweep, retrieval for a retrieval run).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="How many heads per model.")
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
    from .analysis.ranking import controls_note, top_heads_text, unit_note
    from .tables import load

    tables = load(run)
    click.echo(top_heads_text(tables, metric, top))
    for line in [*controls_note(tables.provenance), unit_note(tables.provenance)]:
        click.echo(line)


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Report folder (default: NAME-report beside the first run's folder).")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it already holds a headscan report.")
@click.option("--top", default=10, show_default=True, help="Top heads listed per metric.")
@click.option("--example", default=None,
              help="Sentence whose attention is drawn for each model's heads (default: a short English one).")
@click.option("--no-models", is_flag=True, help="Draw only what needs the tables, without loading the models.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
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
    from .report.examples import check_example
    from .report import check_report_options, check_runs, report_folder, write_report
    from .tables import load
    from .tables.folders import lock

    def progress(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    check_report_options(top=top, out=out, overwrite=overwrite)  # before any model loads
    if not no_models:
        check_example(example)
    check_runs(runs)
    progress(f"reading {len(runs)} run{'s' if len(runs) > 1 else ''}")
    loaded = [load(run) for run in runs]
    check_runs(loaded)
    folder = report_folder(loaded, out)
    with lock(folder):  # held from here, so that a second writer is refused before the models load
        check_report_options(top=top, out=folder, overwrite=overwrite)
        examples = None
        if not no_models:
            from .report.examples import compute_examples

            examples = compute_examples(loaded, example, progress=progress)
            for line in examples.failed:
                click.echo(f"no example attention for {line}", err=True)
        folder = write_report(loaded, folder, top=top, examples=examples, progress=progress, overwrite=overwrite)
    click.echo(f"wrote {folder}/index.html and {folder}/report.md")
