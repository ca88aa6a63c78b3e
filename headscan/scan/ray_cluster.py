"""Reaching the Ray cluster a sweep runs on, and sizing its work: how many actors, what each asks for, how many
shards.

`connect` is the one way `headscan.scan.cluster` reaches a cluster (see its docstring for the addresses it
takes); `worker_memory` estimates what one actor holds (the model's weights, a batch's attention, the process);
`worker_resources` reads what the cluster holds and `plan_workers` places as many actors as its nodes' memory,
CPUs and GPUs allow; `choose_shards` cuts a corpus for its workers. Ray is imported only when a sweep asks for it.

This module runs no task and reads no corpus (see `headscan.scan.cluster`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from ..config import SweepConfig, hf_offline, split_control
from ..errors import ConfigError, ModelNotFoundError
from .budget import auto_mode, chunked_bytes, eager_bytes

__all__ = ["Cluster", "connect", "worker_memory", "worker_resources", "plan_workers", "describe_resources",
           "choose_shards", "model_config",
           "SHARDS_PER_WORKER", "CONNECT_TIMEOUT", "PROCESS_BYTES", "WEIGHT_COPIES"]

SHARDS_PER_WORKER = 4  # fast workers take more shards, and a lost worker costs one small shard
CONNECT_TIMEOUT = 10.0  # seconds to wait for a cluster's port to answer
# A worker's own process before any model: Python with torch, transformers and Ray's worker (about 0.5 GiB
# resident measured with torch and transformers imported; Ray's worker and the corpus add to it).
PROCESS_BYTES = 2**30
# The weights twice: the model's own, and what a sweep holds beside them (the logit directions, a d_model x vocab
# copy; loading's own copies; the activations of layers besides the one the attention term counts). Measured on
# 64 EWT test sentences at the defaults (/usr/bin/time -f %M headscan sweep ... --device cpu): smollm2's whole
# process peaked at 2.12 GiB (0.50 GiB of weights, 0.34 GiB after imports), minilm's at 0.92 GiB; the estimate
# is 2.04 and 1.22 GiB. Eager mode holding more than one layer's pattern is the part it misses.
WEIGHT_COPIES = 2
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
_CPU_BUDGET = 8 * 2**30  # the most one layer's eager attention takes on a CPU before auto goes chunked (budget.py)


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster a sweep runs on."""

    address: str  # as given, or "local"
    client: bool  # reached through Ray Client (ray://): the driver is not one of its machines


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ConfigError("ray: Ray is not installed; pip install 'headscan[ray]'", setting="ray") from None
    return ray


def _check_reachable(address: str) -> None:
    """One line, at once, for an address nothing answers at (Ray itself retries for minutes, then exits)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ConfigError(f"ray: {address!r} is not a Ray address; use auto, HOST:PORT (a head node, port 6379) "
                          f"or ray://HOST:PORT (Ray Client, port 10001)", setting="ray")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as error:
        raise ConfigError(f"ray: cannot reach a Ray cluster at {address} ({error.strerror or error}); start one "
                          f"there with `ray start --head`, or check the host and port", setting="ray") from None


@contextlib.contextmanager
def connect(address: str | bool | None = None):
    """Connect to the Ray cluster at `address` for the length of the block, and yield it as a `Cluster`.

    `address` is None or True (the cluster in ``RAY_ADDRESS``, else one started on this machine with
    ``ray start``, else a new local instance, shut down when the block ends), ``"auto"`` (a running cluster
    only), ``"local"`` (always a new local instance), ``"HOST:PORT"`` or ``"ray://HOST:PORT"``. A process
    already connected (a notebook's own ``ray.init(...)``) keeps its connection; it then takes no address.
    """
    ray = _import_ray()
    address = None if address in (None, True, "") else str(address)
    named = address or os.environ.get("RAY_ADDRESS") or None
    if named and named not in ("auto", "local"):
        _check_reachable(named)
    if ray.is_initialized():
        if address is not None:
            raise ConfigError(f"ray: this process is already connected to a Ray cluster; pass ray=True to use it, "
                              f"or call ray.shutdown() before connecting to {address}", setting="ray")
        from ray.util.client import ray as ray_client

        if ray_client.is_connected():
            yield Cluster(os.environ.get("RAY_ADDRESS") or "ray client", client=True)
        else:
            yield Cluster(ray.get_runtime_context().gcs_address or "local", client=False)
        return
    client = (named or "").startswith("ray://")
    options = {} if client else dict(include_dashboard=False, log_to_driver=False)
    try:
        ray.init(address, logging_level=logging.WARNING, **options)
    except Exception as error:  # ConnectionError, ValueError, RuntimeError: what Ray raises varies
        where = f"at {address}" if address else "on this machine"
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        token = "" if os.environ.get("RAY_AUTH_MODE") or not named else (
            "; a cluster that asks for a token (new clusters do) needs RAY_AUTH_MODE=token here, with its token in "
            "RAY_AUTH_TOKEN or ~/.ray/auth_token")
        raise ConfigError(f"ray: cannot connect to a Ray cluster {where}: {first}{token}", setting="ray") from None
    try:
        yield Cluster(named or "local", client)
    finally:
        ray.shutdown()


def model_config(spec: str):
    """The Hugging Face config of `spec` (an alias, a folder, a .gguf file or a hub id), read as `load_model`
    would find it; nothing else is read."""
    from transformers import AutoConfig

    from ..models import ALIASES
    from ..models.series import revision_folder, split_revision

    hub_id, revision = split_revision(spec)
    target = ALIASES[spec].locate() if spec in ALIASES else Path(spec).expanduser() if revision is None else \
        revision_folder(hub_id, revision, offline=hf_offline())
    try:
        if target.suffix == ".gguf":
            return AutoConfig.from_pretrained(target.parent, gguf_file=target.name)
        return AutoConfig.from_pretrained(target if target.exists() else spec)
    except (OSError, ValueError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise ModelNotFoundError(f"model {spec!r}: no readable config to size its Ray workers by ({first})") from None


def worker_memory(spec: str, config: SweepConfig) -> int:
    """Bytes of host memory one actor holds while it sweeps `spec`: `WEIGHT_COPIES` times the weights in the
    sweep's dtype (the parameters counted on torch's meta device, from the config alone), one layer's attention
    for a batch at its peak (eager or chunked as ``attention`` will choose, `headscan.scan.budget`; on the GPU
    where the model runs there), and `PROCESS_BYTES`.
    """
    import torch
    from transformers import AutoModel

    hf_config = model_config(split_control(spec)[0])
    with torch.device("meta"):
        model = AutoModel.from_config(hf_config)
    parameters = sum(p.numel() for p in model.parameters())
    if not getattr(hf_config, "tie_word_embeddings", True):  # an output matrix of its own, which AutoModel leaves out
        parameters += getattr(hf_config, "vocab_size", 0) * getattr(hf_config, "hidden_size", 0)
    weights = WEIGHT_COPIES * parameters * _DTYPE_BYTES[config.dtype]
    if config.device in ("cuda", "mps"):
        return weights + PROCESS_BYTES  # weights pass through the host on load; activations stay on the device
    heads = getattr(hf_config, "num_attention_heads", None) or getattr(hf_config, "n_head", 1)
    eager = eager_bytes(heads, config.batch_size, config.max_len)
    chunked = chunked_bytes(heads, config.batch_size, config.max_len, config.query_chunk)
    budget = config.attention_budget * 2**20 if config.attention_budget is not None else _CPU_BUDGET
    # the rule the worker's sweep follows (budget.choose), short of asking the model whether chunked mode runs
    auto = config.attention == "auto" and auto_mode(heads, config.batch_size, config.max_len, budget) == "eager"
    attention = eager if config.attention == "eager" or auto else chunked
    return weights + attention + PROCESS_BYTES


def worker_resources(config: SweepConfig, cluster: Cluster, memory: int) -> tuple[int, dict]:
    """How many actors the cluster holds at once, and what each asks for (see `plan_workers`)."""
    import ray

    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    return plan_workers(nodes, memory=memory, device=config.device, device_map=config.device_map,
                        address=cluster.address)


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def plan_workers(nodes: list[dict], *, memory: int, device: str = "auto", device_map: str | None = None,
                 address: str = "local") -> tuple[int, dict]:
    """How many actors fit on `nodes` (each node's Ray resources: ``CPU``, ``GPU``, ``memory`` in bytes), and what
    each asks for, when one holds `memory` bytes.

    Each actor asks for `memory` (Ray's ``memory`` resource), so Ray places on a node only as many as its memory
    holds. On GPUs: one GPU each, or with `device_map` (``auto``: the model spread over a node's GPUs) every GPU of
    a node, one actor per node. On CPUs: a node's CPUs are shared out among the actors its memory holds, each
    running torch on its share (``num_cpus``: Ray sets each actor's thread count to it).

    >>> node = {"CPU": 64.0, "memory": 256 * 2**30}
    >>> plan_workers([node], memory=30 * 2**30)  # a 30 GiB model: 8 actors of 8 CPUs, not 64 of one
    (8, {'num_cpus': 8, 'memory': 32212254720})
    >>> plan_workers([node | {"GPU": 4.0}, node | {"GPU": 4.0}], memory=2**30, device_map="auto")[0]  # one a node
    2
    """
    if device == "cuda" and not any(node.get("GPU", 0) >= 1 for node in nodes):
        raise ConfigError(f"device cuda: the Ray cluster ({address}) has no GPUs; use --device cpu, or auto "
                          f"(a GPU per worker where the cluster has them)", setting="device")

    def fits(node: dict) -> int:  # actors of `memory` bytes a node holds (Ray without a memory resource: no limit)
        return int(node["memory"] // memory) if "memory" in node else 1 << 30

    largest = max((node.get("memory", 0) for node in nodes), default=0)
    gpu_nodes = [node for node in nodes if node.get("GPU", 0) >= 1]
    if gpu_nodes and device in ("auto", "cuda"):
        if device_map is not None:  # the model spread over every GPU of a node: one actor a node
            gpus = int(min(node["GPU"] for node in gpu_nodes))
            workers = sum(1 for node in gpu_nodes if fits(node) >= 1)
            resources = {"num_gpus": gpus, "num_cpus": 1, "memory": memory}
        else:
            workers = sum(min(int(node["GPU"]), fits(node), int(node.get("CPU", 1))) for node in gpu_nodes)
            resources = {"num_gpus": 1, "num_cpus": 1, "memory": memory}
    else:
        cpu_nodes = [node for node in nodes if node.get("CPU", 0) >= 1 and fits(node) >= 1]
        # each node's CPUs shared out among the actors its memory holds; the smallest share, so every node takes one
        threads = min((int(node["CPU"]) // min(int(node["CPU"]), fits(node)) for node in cpu_nodes), default=1)
        workers = sum(min(int(node["CPU"]) // threads, fits(node)) for node in cpu_nodes)
        resources = {"num_cpus": threads, "memory": memory}
    if workers < 1:
        raise ConfigError(f"ray: a worker needs about {_gib(memory)} of memory for the largest model at this "
                          f"--batch-size and --max-len, and no node of the Ray cluster ({address}) has that much "
                          f"(largest: {_gib(largest)}); lower --batch-size or --max-len, use --dtype bfloat16, or "
                          f"add a larger node", setting="ray")
    return workers, resources


def describe_resources(resources: dict) -> str:
    """What one actor asks for, in words.

    >>> describe_resources({"num_cpus": 8, "memory": 3 * 2**30})
    '8 CPUs and 3.0 GiB'
    >>> describe_resources({"num_gpus": 1, "num_cpus": 1, "memory": 2**30})
    '1 GPU and 1.0 GiB'
    """
    if "num_gpus" in resources:
        unit, count = "GPU", resources["num_gpus"]
    else:
        unit, count = "CPU", resources["num_cpus"]
    return f"{count} {unit}{'s' if count != 1 else ''} and {_gib(resources['memory'])}"


def choose_shards(n_documents: int, n_segments: int, workers: int, batch_size: int) -> int:
    """How many shards to cut a corpus into for `workers` workers: `SHARDS_PER_WORKER` each, so that fast
    workers take more and a lost one costs little, but at most one per document and none under a batch.

    >>> choose_shards(n_documents=2000, n_segments=2000, workers=2, batch_size=16)
    8
    >>> choose_shards(n_documents=3, n_segments=300, workers=8, batch_size=16)  # three documents
    3
    >>> choose_shards(n_documents=40, n_segments=40, workers=2, batch_size=16)  # two batches' worth
    2
    """
    return max(1, min(n_documents, SHARDS_PER_WORKER * workers, n_segments // batch_size))
