"""Out of memory in the middle of training steps, then recovery (tests/reliability/test_faults.py).

Run with a small device (TORCH_NEURONX_SIM_HBM). A nanoGPT trains on `neuron` beside the same model
on CPU. One step gets a batch whose forward does not fit; another fails in its backward (a hook
asks for a workspace that does not fit, after the later layers' gradients were made). After each,
the program does what a user does (drop the step's gradients, `empty_cache()`) and trains on: the
losses must stay equal to the CPU model's, which never saw the failed steps, and device memory must
come back to what it was. Prints a JSON summary.
"""
import json
import os
import sys

import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.testing.models import NanoGPT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import CONFIG, batch, train_step  # noqa: E402  (the soak's model size, data and step)

MiB = 2**20


def main():
    torch.manual_seed(0)
    ref = NanoGPT(**CONFIG)
    model = NanoGPT(**CONFIG)
    model.load_state_dict(ref.state_dict())
    model = model.to("neuron")
    opt, ref_opt = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res = {"losses": [], "ref_losses": [], "capacity_mib": torch.neuron.get_device_properties(0).total_memory / MiB}
    step = 0

    def good_steps(k):
        nonlocal step
        for _ in range(k):
            step += 1
            x, y = batch(step)
            res["losses"].append(train_step(model, opt, x.to("neuron"), y.to("neuron")).item())
            res["ref_losses"].append(train_step(ref, ref_opt, x, y).item())

    good_steps(3)
    torch.neuron.synchronize()
    res["allocated_before_mib"] = torch.neuron.memory_allocated() / MiB

    # 1. The forward does not fit: 2,048 sequences (the logits alone are 256 MiB).
    x, y = batch(10_000, n=2048)
    try:
        train_step(model, opt, x.to("neuron"), y.to("neuron"))
        res["forward_oom"] = None
    except torch.OutOfMemoryError as e:
        res["forward_oom"] = str(e).split("\n")[0]
    del x, y
    opt.zero_grad(set_to_none=True)
    torch.neuron.empty_cache()
    good_steps(3)

    # 2. The backward does not fit: the first block's backward asks for a 1 GiB workspace, after
    # the head's and the second block's gradients were accumulated.
    def workspace(module, grad_in, grad_out):
        torch.empty(1 << 30, dtype=torch.uint8, device="neuron")

    hook = model.blocks[0].register_full_backward_hook(workspace)
    x, y = batch(step + 1)
    try:
        train_step(model, opt, x.to("neuron"), y.to("neuron"))
        res["backward_oom"] = None
    except torch.OutOfMemoryError as e:
        res["backward_oom"] = str(e).split("\n")[0]
        res["grads_present_after_backward_oom"] = sum(p.grad is not None for p in model.parameters())
    hook.remove()
    opt.zero_grad(set_to_none=True)  # the failed step's partial gradients
    torch.neuron.empty_cache()
    good_steps(4)
    torch.neuron.synchronize()
    res["allocated_after_mib"] = torch.neuron.memory_allocated() / MiB
    res["num_ooms"] = torch.neuron.memory_stats()["num_ooms"]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
