"""A compile job for the cache tests: compiles a pointwise chain (inference), an MLP training
step (forward and backward) and a function returning aliased outputs on neuron, checks them
against eager, and prints the compile metrics
and the seconds of each first call as JSON."""
import json
import sys
import time

import torch
import torch.nn as nn
import torch_neuronx  # noqa: F401
from torch_neuronx.compile import compile_metrics


def chain(x, y):
    return torch.sigmoid(x * 2 + y).tanh() * torch.exp(-x) + torch.relu(y - 0.5)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(33, 64), nn.Linear(64, 1)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


g = torch.Generator().manual_seed(0)
x, y = torch.randn(64, 33, generator=g), torch.randn(64, 33, generator=g)
t0 = time.perf_counter()
out = torch.compile(chain, backend="neuron")(x.to("neuron"), y.to("neuron")).cpu()
chain_s = time.perf_counter() - t0
torch.testing.assert_close(out, chain(x, y), rtol=1e-5, atol=1e-6)

torch.manual_seed(0)
model = MLP()
ref = MLP()
ref.load_state_dict(model.state_dict())
model = model.to("neuron")
t0 = time.perf_counter()
loss = torch.compile(model, backend="neuron")(x.to("neuron")).square().mean()
loss.backward()
step_s = time.perf_counter() - t0
ref_loss = ref(x).square().mean()
ref_loss.backward()
torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6)
torch.testing.assert_close(model.a.weight.grad.cpu(), ref.a.weight.grad, rtol=1e-5, atol=1e-6)

# Outputs that alias another output (a view of an intermediate): AOTAutograd regenerates them
# after the graph ran, also when the graph comes from its cache.
def heads(x):
    y = x * 2
    return y, y.view(8, -1)[1:].transpose(0, 1)


h = torch.compile(heads, backend="neuron")(x.to("neuron"))
for got, want in zip(h, heads(x)):
    torch.testing.assert_close(got.cpu(), want)

m = compile_metrics()
from torch._dynamo.utils import counters  # noqa: E402
print(json.dumps({**{k: m[k] for k in ("compiles", "cache_hits", "graph_cache_hits", "kernels_built",
                                       "kernel_cache_hits", "kernel_cache_corrupt", "compile_seconds")},
                  "chain_first_call_s": chain_s, "step_first_call_s": step_s,
                  "aot_autograd": dict(counters["aot_autograd"])}))
sys.stdout.flush()
