"""The c10d backend ``neuron``: ``torch.distributed.init_process_group(backend="neuron")``.

Registered for the ``neuron`` device (and ``cpu``, so that object collectives and CPU
tensors work in a ``neuron`` group too). Collectives on neuron tensors run on each device's
collective queue, ordered after the caller's current stream; Gloo (shipped with PyTorch) moves
the data between processes, across hosts with the usual ``torchrun`` rendezvous.
"""
import datetime

import torch.distributed as dist

from . import _C

BACKEND = "neuron"


def _create_backend(store, rank: int, size: int, timeout: datetime.timedelta):
    # The transport gets its own key space in the group's store.
    transport = dist.ProcessGroupGloo(dist.PrefixStore("neuron_transport/", store), rank, size, timeout)
    return _C._distributed.ProcessGroupNeuron(transport, rank, size, timeout)


def _register() -> None:
    if not dist.is_available() or BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["neuron", "cpu"])
