"""Reaching the Ray cluster a sweep runs on, and sizing its work: how many actors, what each asks for, how many
shards.

`connect` is the one way `headscan.scan.cluster` reaches a cluster (see its docstring for the addresses it
takes); `worker_resources` reads what the cluster holds; `choose_shards` cuts a corpus for its workers. Ray is
imported only when a sweep asks for it.

This module runs no task and reads no corpus (see `headscan.scan.cluster`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from dataclasses import dataclass

from ..config import SweepConfig
from ..errors import ConfigError

__all__ = ["Cluster", "connect", "worker_resources", "choose_shards", "SHARDS_PER_WORKER", "CONNECT_TIMEOUT"]

SHARDS_PER_WORKER = 4  # fast workers take more shards, and a lost worker costs one small shard
CONNECT_TIMEOUT = 10.0  # seconds to wait for a cluster's port to answer


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


def worker_resources(config: SweepConfig, cluster: Cluster) -> tuple[int, dict]:
    """How many actors the cluster holds at once, and what each asks for: a GPU where there are GPUs."""
    import ray

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if config.device == "cuda" and not gpus:
        raise ConfigError(f"device cuda: the Ray cluster ({cluster.address}) has no GPUs; use --device cpu, or auto "
                          f"(a GPU per worker where the cluster has them)", setting="device")
    if gpus and config.device in ("auto", "cuda"):
        return gpus, {"num_gpus": 1, "num_cpus": 1}
    return max(1, int(resources.get("CPU", 1))), {"num_cpus": 1}


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
