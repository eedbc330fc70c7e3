"""The c10d backend ``neuron``: ``torch.distributed.init_process_group(backend="neuron")``.

Registered for the ``neuron`` device (and ``cpu``, so that object collectives and CPU
tensors work in a ``neuron`` group too). Collectives on neuron tensors run on each device's
collective queue, ordered after the caller's current stream; Gloo (shipped with PyTorch) moves
the data between processes, across hosts with the usual ``torchrun`` rendezvous.
"""
import datetime
import os

import torch.distributed as dist

from . import _C

BACKEND = "neuron"


# The collective queue issues collectives in order and the data transport runs several at once:
# over TORCH_NEURONX_DIST_CONNECTIONS connections to each peer (Gloo spreads collectives over them
# by tag), with two worker threads per connection (TORCH_NEURONX_DIST_THREADS). On one connection,
# a collective's segments queue behind another's bytes; two let both rings stream at once
# (bench/collectives.py: 1.1-1.25x the bandwidth of Gloo's default of one connection and two
# threads, from 4 MB up, on 2 cores). The control transport carries one fingerprint exchange at a
# time (and the backend's point-to-point algorithms, which need no worker thread).
DEFAULT_CONNECTIONS = 2
CONTROL_CONNECTIONS = 1
CONTROL_THREADS = 1


def _env_count(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name}={value!r}: expected a positive integer (unset it for the default, {default})")
    return n


def _gloo(store, prefix: str, rank: int, size: int, timeout: datetime.timedelta, threads: int,
          connections: int):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._threads = threads
    ifnames = os.environ.get("GLOO_SOCKET_IFNAME")
    # One Gloo device is one connection to each peer; with several interfaces, at least one each.
    if ifnames:
        names = ifnames.split(",")
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=names[i % len(names)])
                         for i in range(max(connections, len(names)))]
    else:
        opts._devices = [dist.ProcessGroupGloo.create_default_device() for _ in range(connections)]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, opts)


def _transports(store, rank: int, size: int, timeout: datetime.timedelta):
    """The two Gloo process groups of a neuron group, each in its own key space of `store`: one
    moves the data, the other (its own connections) carries the check that precedes each
    collective, so that check does not wait behind the previous collective's bytes."""
    connections = _env_count("TORCH_NEURONX_DIST_CONNECTIONS", DEFAULT_CONNECTIONS)
    threads = _env_count("TORCH_NEURONX_DIST_THREADS", 2 * connections)
    return (_gloo(store, "neuron_transport/", rank, size, timeout, threads, connections),
            _gloo(store, "neuron_control/", rank, size, timeout, CONTROL_THREADS, CONTROL_CONNECTIONS))


def _create_backend(store, rank: int, size: int, timeout: datetime.timedelta):
    return _C._distributed.ProcessGroupNeuron(*_transports(store, rank, size, timeout), rank, size, timeout)


def _register() -> None:
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["neuron", "cpu"])
