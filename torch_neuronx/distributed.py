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
# over TRANSPORT_CONNECTIONS connections to each peer (Gloo spreads collectives over them by tag),
# with two worker threads per connection. One connection carries one collective's segments at a
# time behind the other's bytes; two let both rings stream at once (bench/collectives.py: about
# 1.2x the bandwidth of Gloo's default of one connection and two threads, from 1 MB up, on 2 cores).
# The control transport carries one fingerprint exchange at a time (and the backend's
# point-to-point algorithms, which need no worker thread).
TRANSPORT_CONNECTIONS = int(os.environ.get("NEURON_DIST_CONNECTIONS", "2"))
TRANSPORT_THREADS = int(os.environ.get("NEURON_DIST_THREADS", str(2 * TRANSPORT_CONNECTIONS)))
CONTROL_CONNECTIONS = int(os.environ.get("NEURON_DIST_CONTROL_CONNECTIONS", "1"))
CONTROL_THREADS = 1


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
    return (_gloo(store, "neuron_transport/", rank, size, timeout, TRANSPORT_THREADS, TRANSPORT_CONNECTIONS),
            _gloo(store, "neuron_control/", rank, size, timeout, CONTROL_THREADS, CONTROL_CONNECTIONS))


def _create_backend(store, rank: int, size: int, timeout: datetime.timedelta):
    return _C._distributed.ProcessGroupNeuron(*_transports(store, rank, size, timeout), rank, size, timeout)


def _register() -> None:
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["neuron", "cpu"])
