"""Sweeps on a Ray cluster: the corpus cut into shards, one actor per worker holding one model, shards merged.

`sweep_on_ray` is where ``headscan.sweep(..., ray=True)`` and ``headscan sweep --ray [ADDRESS]`` go once
`headscan.scan.run.sweep` has checked the settings, the model specs, the corpus and the output folder:

1. `connect` reaches the cluster: ``--ray`` alone uses the one named by ``RAY_ADDRESS``, else one started on
   this machine with ``ray start``, else a new local instance that lives as long as the sweep; ``--ray auto``
   only a running one; ``--ray HOST:6379`` a head node's address, ``--ray ray://HOST:10001`` Ray Client.
2. The corpus is cut into S shards, ``Shard(k, S)``: the documents whose index is k modulo S. S is
   `choose_shards` (four per worker, at most one per document), or the count of the states a rerun resumes.
3. Each worker runs one actor that holds one loaded model at a time and sweeps the shards it is handed with
   `headscan.scan.reduce.accumulate`, the models in turn. Each actor asks Ray for the memory the largest model
   takes (`worker_memory`: its weights, a batch's attention, the process), so Ray places as many as the nodes'
   memory holds: on CPUs a node's CPUs are shared out among them (torch runs that many threads in each); on
   GPUs each takes one GPU, or with ``device_map`` every GPU of its node (`plan_workers`).
   A task sweeps whole windows for about `save_every` seconds, then hands the shard's `PartialState` back,
   finished or not; the driver saves it as ``OUT.partial/MODEL.shard-K-of-S.npz`` (`state_file`) and hands
   the rest of the shard out again.
4. A task whose worker is lost (actor or process killed, node gone, out of memory) goes to a new actor, from
   the shard's last state, up to `RETRIES` times; rerunning the command sweeps only what ``OUT.partial`` lacks.
5. The driver adds each model's shards up (`merge_states`), finishes and publishes them as one set. They are
   a local sweep's tables up to the float32 forward pass: a segment's
   forward can differ by ~1e-8 with the batch it is in, and with the number of torch threads (MKL's matrix
   products split their sums by thread for short inputs); with ``batch_size=1`` and the workers running as many
   threads as the local sweep, they agree to 1e-12, intervals included. Provenance records ``ray``
   (``run.json``; ``provenance.extra["ray"]``): the address (or "local"), the shard count, the workers, what
   each asked for (``worker``: ``num_cpus`` or ``num_gpus``, and ``memory`` in bytes) and the retries.

On a one-machine cluster the workers read a corpus file themselves; on several machines (or through Ray
Client) its segments travel with the tasks, as do the texts of ``--metric-module`` files. Model paths must name
the same files on every machine. This module does not score heads (`headscan.scan.reduce`), check inputs
(`headscan.scan.run`) or manage clusters (``ray start``, ``ray up``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..config import SweepConfig
from ..corpus import Corpus
from ..errors import ConfigError, HeadscanError, ModelLoadError, SweepInterrupted, TablesError
from ..metrics.custom import install, sources_for_workers
from ..tables import SweepTables
from .controls import corpus_for, load_swept
from .finish import publish, run_provenance
from .plan import plan_sweep
from .ray_cluster import Cluster, choose_shards, connect, describe_resources, worker_memory, worker_resources
from .reduce import accumulate
from .resume import SAVE_EVERY, check_resumable, kept_states, partial_folder, spec_stem, state_file, stop_requests
from .state import PartialState, Shard, merge_states

__all__ = ["sweep_on_ray", "connect", "choose_shards", "ClusterError", "RETRIES"]

RETRIES = 3  # times a task whose worker was lost goes to a new actor before the sweep gives up
_SHARD_FILE = re.compile(r"\.shard-(\d+)-of-(\d+)\.npz$")


class ClusterError(HeadscanError):
    """The cluster lost a task's worker more often than the retries allow; finished shards are kept."""


# --- the actor -----------------------------------------------------------------------------------------------


def _owned(state):
    """`state` (a `PartialState`, and each pass's state in it) with arrays of its own: Ray hands numpy arrays over
    read-only, in its shared object store, and a resumed sweep adds into every total (the passes' sums too)."""
    for field in dataclasses.fields(state):
        value = getattr(state, field.name)
        if isinstance(value, np.ndarray):
            setattr(state, field.name, np.array(value))
    for own in getattr(state, "passes", {}).values():
        if dataclasses.is_dataclass(own):
            _owned(own)
    return state


class _Worker:
    """The actor on one worker: holds one loaded model at a time and sweeps the shards it is handed."""

    def __init__(self, corpus: Corpus, config: SweepConfig, cwd: str | None, threads: int | None = None,
                 unit_why: str | None = None, metric_sources: tuple = ()):
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)  # relative model paths mean what they meant to the driver
        install(*metric_sources)  # the user's metrics: the very text the driver read, not this node's file
        if threads:  # the CPUs Ray gave this actor (Ray sets OMP_NUM_THREADS to them too; torch may have read it late)
            import torch

            torch.set_num_threads(threads)
        self.corpus, self.config, self.unit_why = corpus, config, unit_why  # the unit resolved by the driver
        self.spec = self.model = None  # the name swept (a model or a control of one) and its loaded model

    def _load(self, spec: str):
        if spec != self.spec:
            import torch

            self.spec = self.model = None  # one model in memory at a time
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            self.model = load_swept(spec, self.config)
            self.spec = spec
        return self.model

    def run(self, spec: str, shard: Shard, state: PartialState | None, source: str,
            seconds: float) -> tuple[PartialState, str]:
        """Sweep `shard` on from `state` for about `seconds` (whole windows); the state and the device used.

        A state from `source` (a saved file) that another sweep made is refused, as a local sweep refuses it.
        """
        model = self._load(spec)
        corpus = corpus_for(spec, self.corpus, self.config)
        plan = plan_sweep(model, corpus, self.config, shard, unit_why=self.unit_why)
        if state is not None:
            state = _owned(state)
            check_resumable(state, plan.fingerprint, shard, source, spec)
            if state.finished:
                return state, model.device.type
        latest: dict[str, PartialState] = {}

        def save(saved: PartialState) -> None:  # a window ended after `seconds`: hand the state back
            latest["state"] = saved

        try:
            state = accumulate(model, corpus, plan, state=state, save=save,
                               save_every=seconds, should_stop=lambda: "state" in latest)
        except SweepInterrupted:  # stopped before the next window: the state as of the last window's end
            state = latest["state"]
        return state, model.device.type


# --- the driver ----------------------------------------------------------------------------------------------


@dataclass
class _Task:
    """Sweep `shard` of `spec` on from `state` (None: from its start; finished: only check the fingerprint)."""

    spec: str
    shard: Shard
    state: PartialState | None = None
    source: str = "this run"  # where `state` came from, for messages
    failures: int = 0


class _Slot:
    """One worker: its actor, the model that actor holds and the task it runs."""

    def __init__(self, make_actor):
        self.make_actor = make_actor
        self.actor = make_actor()
        self.spec: str | None = None
        self.task: _Task | None = None

    def submit(self, task: _Task, seconds: float):
        self.task, self.spec = task, task.spec
        return self.actor.run.remote(task.spec, task.shard, task.state, task.source, seconds)

    def replace(self) -> None:
        """A new actor (on whichever machine has room) for one that was lost."""
        self.kill()
        self.actor, self.spec = self.make_actor(), None

    def kill(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor)


def _next_task(queue: deque, spec: str | None) -> _Task:
    """The first task for the model the worker already holds, else the first task."""
    for i, task in enumerate(queue):
        if task.spec == spec:
            del queue[i]
            return task
    return queue.popleft()


def _short(spec: str) -> str:
    return spec.rstrip("/").rsplit("/", 1)[-1]


class _Progress:
    """One line across all tasks: shards done per model, and tokens per second since the first task ended
    (the workers' start and first model load are not in the rate)."""

    def __init__(self, totals: dict[str, int], done: dict[str, int], enabled: bool, heading: str):
        self.totals, self.done = totals, done
        self.tokens, self.since = 0, None
        self.bar = None
        if enabled:
            from tqdm import tqdm

            print(heading, file=sys.stderr)
            self.bar = tqdm(total=sum(totals.values()), initial=sum(done.values()), desc="sweep on ray", unit="shard",
                            file=sys.stderr, dynamic_ncols=True)
            self._show()

    def _show(self) -> None:
        shards = ", ".join(f"{_short(spec)} {self.done[spec]}/{total}" for spec, total in self.totals.items())
        rate = "" if not self.tokens else f", {self.tokens / max(time.perf_counter() - self.since, 1e-9):,.0f} tok/s"
        self.bar.set_postfix_str(shards + rate, refresh=True)

    def advance(self, spec: str, tokens: int, finished: bool) -> None:
        if self.since is None:
            self.since = time.perf_counter()
        else:
            self.tokens += tokens
        self.done[spec] += finished
        if self.bar is not None:
            self.bar.update(int(finished))
            self._show()

    def drop(self, spec: str) -> None:
        if self.bar is not None:
            self.bar.total -= self.totals[spec] - self.done[spec]
        self.totals.pop(spec)

    def note(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


_Saved = dict[str, dict[int, tuple[Path, PartialState]]]  # model -> shard index -> (file, state)


def _saved_states(partial: Path | None, models: list[str]) -> tuple[int | None, _Saved]:
    """The shard states an earlier run left in `partial`, per model and shard index, and their shard count."""
    saved: _Saved = {spec: {} for spec in models}
    counts: set[int] = set()
    if partial is None or not partial.is_dir():
        return None, saved
    for spec in models:
        if (partial / state_file(spec, None)).is_file():
            raise TablesError(f"{partial}: holds the state of a stopped sweep of {spec} without --ray; finish it "
                              f"without --ray, or pass --restart to discard it")
        for path in sorted(partial.glob(f"{spec_stem(spec)}.shard-*-of-*.npz")):
            match = _SHARD_FILE.search(path.name)
            if match is None or path.name != spec_stem(spec) + match.group(0):
                continue  # another model's, whose name begins with this one's
            state = PartialState.load(path)
            if state.shard is None or path.name != state_file(spec, state.shard):
                raise TablesError(f"{path}: holds the state of shard {state.shard}, not the one its name says; "
                                  f"pass --restart to start over")
            saved[spec][state.shard.index] = (path, state)
            counts.add(state.shard.count)
    if len(counts) > 1:
        raise TablesError(f"{partial}: holds shard states of {' and '.join(map(str, sorted(counts)))} shards; "
                          f"pass --restart to start over")
    return (counts.pop() if counts else None), saved


def sweep_on_ray(
    models: list[str],
    corpus: Corpus,
    out: str | Path | None,
    config: SweepConfig,
    *,
    address: str | bool | None = None,
    shards: int | None = None,
    shard: Shard | None = None,
    overwrite: bool = False,
    progress: bool = False,
    command: str | None = None,
    save_every: float = SAVE_EVERY,
    retries: int | None = None,
    unit_why: str | None = None,
) -> SweepTables:
    """Sweep `models` over `corpus` on the Ray cluster at `address` (see `connect`); publish into `out` if given.

    Called by `headscan.scan.run.sweep` (``ray=...``) after its checks; `corpus` is read already, and `out` was
    checked for writing. `shards` fixes the shard count (default: `choose_shards`, or the count of the
    states in ``OUT.partial`` that a rerun resumes). `save_every` is how long a task sweeps before it hands
    its state back to be saved; `retries` how often a task whose worker was lost goes to a new actor
    (default: `RETRIES`).
    """
    retries = RETRIES if retries is None else retries
    if unit_why is None or config.bootstrap_unit == "auto":  # resolved once, by `headscan.scan.run.sweep`
        raise ValueError("sweep_on_ray needs the config with its bootstrap unit resolved, and why (unit_why)")
    if shard is not None:
        raise ConfigError("shard: a sweep on Ray cuts the corpus into shards itself; run each --shard K/N without "
                          "--ray, or the whole corpus with --ray", setting="shard")
    if shards is not None and not 1 <= shards <= corpus.n_documents:
        raise ConfigError(f"shards must be between 1 and the corpus' {corpus.n_documents} documents, got {shards}",
                          setting="shards")
    partial = partial_folder(out) if out is not None else None
    count, saved = _saved_states(partial, models)
    if count is not None and shards is not None and shards != count:
        raise TablesError(f"{partial}: holds the states of a sweep in {count} shards, not {shards}; ask for {count} "
                          f"shards to resume it, or pass --restart to discard it")
    started = datetime.now(timezone.utc)
    memory = max(worker_memory(spec, config) for spec in models)  # each actor holds one model at a time
    with connect(address) as cluster:
        import ray

        workers, resources = worker_resources(config, cluster, memory)
        count = count or shards or choose_shards(corpus.n_documents, len(corpus.segments), workers, config.batch_size)
        tasks, finished = _tasks(models, saved, count)
        resumed = sum(map(len, saved.values()))
        heading = (f"sweeping {len(models)} model(s) in {count} shards on Ray ({cluster.address}): {workers} "
                   f"worker(s) of {describe_resources(resources)} each"
                   + (f"; resuming {resumed} shard state(s) from {partial}" if resumed else ""))
        shown = _Progress({spec: count for spec in models}, {spec: len(finished[spec]) for spec in models}, progress,
                          heading)
        cwd = None if cluster.client else os.getcwd()
        actor = ray.remote(_Worker).options(max_restarts=0, max_task_retries=0, **resources)
        corpus_ref, sources = ray.put(_portable(corpus, cluster)), sources_for_workers(config.metric_modules)
        threads = None if "num_gpus" in resources else resources["num_cpus"]
        slots = [_Slot(lambda: actor.remote(corpus_ref, config, cwd, threads, unit_why, sources))
                 for _ in range(min(workers, len(tasks)))]
        try:
            with stop_requests() as should_stop:
                skipped, devices, lost = _run(tasks, slots, finished, partial, shown, should_stop, save_every, retries,
                                              n_models=len(models))
        finally:
            shown.close()
            for slot in slots:
                slot.kill()
    swept = [spec for spec in models if spec not in skipped]
    if not swept:
        raise ModelLoadError(f"no model could be swept: {'; '.join(skipped.values())}")
    totals = [merge_states([finished[spec][k] for k in range(count)], [f"shard {k}/{count} of {spec}"
                                                                        for k in range(count)]) for spec in swept]
    provenance = run_provenance(corpus, dataclasses.replace(config, device="cpu"), command=command, started=started,
                                unit_why=unit_why)  # the driver's device says nothing; the workers' follows
    extra = {"ray": {"address": cluster.address, "shards": count, "workers": len(slots), "retries": lost,
                     "worker": resources}} | ({"skipped": skipped} if skipped else {})
    provenance = dataclasses.replace(provenance, config=provenance.config | {"device": ", ".join(sorted(devices))},
                                     extra=provenance.extra | extra)
    kept = kept_states(zip(swept, totals), part=config.layers is not None)  # joined with the other layers' by merge
    return publish(totals, config, provenance, out, overwrite=overwrite, extra=kept, partial=partial)


def _tasks(models: list[str], saved: _Saved, count: int) -> tuple[list[_Task], dict]:
    """The tasks of a sweep in `count` shards, and the shards finished already (model -> shard index -> state)."""
    tasks, finished = [], {spec: {} for spec in models}
    for spec in models:
        done = {k: (path, state) for k, (path, state) in saved[spec].items() if state.finished}
        if done:  # one task checks, on the model itself, that the earlier run swept the same thing
            k, (path, state) = next(iter(sorted(done.items())))
            tasks.append(_Task(spec, state.shard, state, str(path)))
            finished[spec] = {k: state for k, (_, state) in done.items()}
        for k in range(count):
            if k not in done:
                path, state = saved[spec].get(k, (None, None))
                tasks.append(_Task(spec, Shard(k, count), state, str(path) if path else "this run"))
    return tasks, finished


def _portable(corpus: Corpus, cluster: Cluster) -> Corpus:
    """The corpus as the workers can read it: a file's segments travel with it unless the cluster is this machine."""
    import ray

    if isinstance(corpus.segments, tuple):
        return corpus
    if cluster.client or sum(node["Alive"] for node in ray.nodes()) > 1:
        return dataclasses.replace(corpus, segments=tuple(corpus.segments))
    return corpus


def _run(tasks: list[_Task], slots: list[_Slot], finished: dict, partial: Path | None, shown: _Progress,
         should_stop, save_every: float, retries: int, n_models: int) -> tuple[dict[str, str], set[str], int]:
    """Hand the tasks out to the slots until every shard is finished; save each state as it comes back.

    Fills `finished` (model -> shard index -> state); returns the models skipped (with why), the devices
    the workers used, and how many tasks were retried.
    """
    import ray
    from ray.exceptions import RayError, RayTaskError

    queue, running, idle = deque(tasks), {}, list(slots)
    skipped: dict[str, str] = {}
    devices: set[str] = set()
    lost = 0
    kept = f"the finished shards are saved in {partial}; run the same command again to resume" if partial else \
        "nothing was saved (no out)"
    while queue or running:
        if should_stop():
            raise SweepInterrupted(f"stopped while sweeping on Ray: {kept}")
        while queue and idle:
            slot = idle.pop()
            running[slot.submit(_next_task(queue, slot.spec), save_every)] = slot
        ready, _ = ray.wait(list(running), num_returns=1, timeout=0.2)
        for ref in ready:
            slot = running.pop(ref)
            task = slot.task
            idle.append(slot)
            if task.spec in skipped:
                continue
            try:
                state, device = ray.get(ref)
            except RayTaskError as error:
                cause = error.cause
                if isinstance(cause, KeyboardInterrupt):
                    raise SweepInterrupted(f"stopped while sweeping on Ray: {kept}") from None
                if isinstance(cause, ModelLoadError) and n_models > 1:  # sweep the others, as a local sweep does
                    skipped[task.spec] = str(cause)
                    shown.note(f"skipped {task.spec}: {cause}")
                    shown.drop(task.spec)
                    queue = deque(t for t in queue if t.spec != task.spec)
                    continue
                if isinstance(cause, HeadscanError):
                    raise cause from None
                raise
            except RayError as error:  # the worker was lost, not the task's own error: retry elsewhere
                task.failures += 1
                first = (str(error).strip().splitlines() or [""])[0][:200]
                if task.failures > retries:
                    raise ClusterError(f"shard {task.shard} of {task.spec}: its worker was lost {task.failures} times "
                                       f"({type(error).__name__}: {first}); {kept}") from None
                lost += 1
                start = f"its last state ({task.state.windows_done} windows done)" if task.state else "its start"
                shown.note(f"lost the worker sweeping shard {task.shard} of {task.spec} ({type(error).__name__}); "
                           f"retrying from {start}, {task.failures} of {retries}")
                slot.replace()
                queue.appendleft(task)
                continue
            devices.add(device)
            state = _owned(state)
            if task.state is not None and task.state.finished:  # a check of an earlier run's state: nothing new
                continue
            if partial is not None:
                state.save(partial / state_file(task.spec, task.shard))
            tokens = state.n_tokens - (task.state.n_tokens if task.state is not None else 0)
            shown.advance(task.spec, tokens, state.finished)
            if state.finished:
                finished[task.spec][task.shard.index] = state
            else:
                queue.appendleft(_Task(task.spec, task.shard, state, "this run"))
    return skipped, devices, lost
