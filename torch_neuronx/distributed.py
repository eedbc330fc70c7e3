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


# Transport worker threads: Gloo's default (more measured no faster on 2 cores). The collective
# queue issues collectives in order and the data transport runs several at once; the control
# transport carries one fingerprint exchange at a time (and the backend's point-to-point algorithms,
# which need no worker thread).
TRANSPORT_THREADS = 2
CONTROL_THREADS = 1


def _gloo(store, prefix: str, rank: int, size: int, timeout: datetime.timedelta, threads: int):
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._threads = threads
    ifnames = os.environ.get("GLOO_SOCKET_IFNAME")
    if ifnames:
        opts._devices = [dist.ProcessGroupGloo.create_device(interface=i) for i in ifnames.split(",")]
    else:
        opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, opts)


def _transports(store, rank: int, size: int, timeout: datetime.timedelta):
    """The two Gloo process groups of a neuron group, each in its own key space of `store`: one
    moves the data, the other (its own connections) carries the check that precedes each
    collective, so that check does not wait behind the previous collective's bytes."""
    return (_gloo(store, "neuron_transport/", rank, size, timeout, TRANSPORT_THREADS),
            _gloo(store, "neuron_control/", rank, size, timeout, CONTROL_THREADS))


def _create_backend(store, rank: int, size: int, timeout: datetime.timedelta):
    return _C._distributed.ProcessGroupNeuron(*_transports(store, rank, size, timeout), rank, size, timeout)


def _register() -> None:
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["neuron", "cpu"])
