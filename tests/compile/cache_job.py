"""A compile job for the cache tests: compiles a pointwise chain and an MLP step on neuron, checks
them against eager, and prints the compile metrics as JSON."""
import json
import sys

import torch
import torch_neuronx  # noqa: F401
from torch_neuronx.compile import compile_metrics


def chain(x, y):
    return torch.sigmoid(x * 2 + y).tanh() * torch.exp(-x) + torch.relu(y - 0.5)


g = torch.Generator().manual_seed(0)
x, y = torch.randn(64, 33, generator=g), torch.randn(64, 33, generator=g)
out = torch.compile(chain, backend="neuron")(x.to("neuron"), y.to("neuron")).cpu()
torch.testing.assert_close(out, chain(x, y), rtol=1e-5, atol=1e-6)
m = compile_metrics()
print(json.dumps({k: m[k] for k in ("compiles", "cache_hits", "kernels_built", "kernel_cache_hits",
                                    "kernel_cache_corrupt", "compile_seconds")}))
sys.stdout.flush()
