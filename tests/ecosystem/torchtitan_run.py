"""Runs TorchTitan's trainer unchanged: `torchtitan_run.py neuron|cpu <torchtitan arguments>`.

On `neuron` this is `python -m torchtitan.train`: TorchTitan finds the device through PyTorch's
device-generic lookup. TorchTitan has no CPU mode (it falls back to "cuda"), so the CPU reference
run points that lookup at CPU and gives `torch.cpu` the few memory-statistics functions TorchTitan's
memory monitor calls (all zero), an index from `current_device()` and integer `histc`, and compiles
FlexAttention with aot_eager (PyTorch has no CPU FlexAttention backward); TorchTitan's own code runs
as shipped on neuron."""
import os
import sys

device = sys.argv.pop(1)
if device == "cpu":
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # no torch_neuronx in the reference run
import torch  # noqa: E402

if device == "cpu":
    import types

    import torch._utils

    torch._utils._get_available_device_type = lambda: "cpu"
    props = types.SimpleNamespace(total_memory=24 << 30, name="cpu")
    for name, fn in {"get_device_name": lambda *a: "cpu", "get_device_properties": lambda *a: props,
                     "reset_peak_memory_stats": lambda *a: None, "empty_cache": lambda *a: None,
                     "memory_stats": lambda *a: {}, "max_memory_allocated": lambda *a: 0,
                     "max_memory_reserved": lambda *a: 0, "set_device": lambda *a: None}.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)
    torch.cpu.current_device = lambda: 0  # an index, as barrier(device_ids=[...]) needs (it is "cpu")
    # CPU's histc has no integer kernel (CUDA's and neuron's count integers; TorchTitan's MoE
    # router counts tokens per expert with it): the reference counts them in float64.
    _histc = torch.histc

    def _integer_histc(input, *args, **kwargs):
        if input.is_floating_point():
            return _histc(input, *args, **kwargs)
        return _histc(input.double(), *args, **kwargs).to(input.dtype)

    torch.histc = _integer_histc
else:
    import torch_neuronx  # noqa: F401  (PyTorch also loads it on `import torch`)

# TORCHTITAN_RUN_NO_ONEDNN=1: on AMX hosts CPU's _scaled_mm takes oneDNN's reference float8 matmul
# (~800x slower than the dequantizing path, the same values); the neuron device runs CPU's kernel,
# so float8 comparisons set it for both runs (tests/test_torchao.py explains).
if os.environ.get("TORCHTITAN_RUN_NO_ONEDNN") == "1":
    torch.backends.mkldnn.enabled = False

from torchtitan.train import Trainer, main  # noqa: E402

if device == "cpu":
    # PyTorch refuses FlexAttention's backward on CPU (Inductor has no CPU backward kernel), and
    # TorchTitan compiles flex_attention with Inductor. The reference compiles it with
    # aot_eager instead: flex_attention's own dense implementation and its autograd, which is
    # what the neuron run computes (the neuron compiler does not lower flex_attention yet).
    import torch.nn.attention.flex_attention as flex
    from torchtitan.models.attention import FlexAttentionWrapper

    flex._validate_device = lambda query, key, value: None
    FlexAttentionWrapper._compiled_flex_attn = torch.compile(flex.flex_attention, backend="aot_eager")

main(Trainer)

if device == "cpu":
    # Rarely (seen once in CI), a CPU/Gloo rank aborts during interpreter finalization after
    # TorchTitan has destroyed its process groups ("terminate called without an active exception":
    # a Gloo thread still joinable at static destruction; pytorch/pytorch#190489 has the same
    # symptom). The reference run's results are all logged by then, so it ends without the
    # finalizers. The neuron runs exit normally: their shutdown is under test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
