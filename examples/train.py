"""The one-line device switch: an ordinary PyTorch training loop on `neuron`.

Trains an MLP classifier and a small transformer language model on synthetic
data with a DataLoader that pins memory. The loops are plain PyTorch; the only
device-specific line is `.to(device)`. `import torch` registers the device; the models and data
are the reference ones the tests and benchmarks use (torch_neuronx.testing.models).

    python examples/train.py [--device neuron] [--steps 30]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from torch_neuronx.testing.models import MLP, TinyTransformerLM, classification_data, language_data


def train(name, model, dataset, criterion, device, steps, batch_size, flatten_logits=False):
    model = model.to(device)                      # the only change for neuron
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, pin_memory=True, drop_last=True)
    losses, step, t0 = [], 0, time.perf_counter()
    while step < steps:
        for batch, targets in loader:
            batch = batch.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            optimizer.zero_grad()
            out = model(batch)
            if flatten_logits:
                out, targets = out.reshape(-1, out.shape[-1]), targets.reshape(-1)
            loss = criterion(out, targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step % 10 == 0 or step == 1:
                print(f"  [{name}] step {step:3d}  loss {losses[-1]:.4f}")
            if step >= steps:
                break
    elapsed = time.perf_counter() - t0
    first = sum(losses[:3]) / 3
    last = sum(losses[-3:]) / 3
    print(f"  [{name}] loss {first:.4f} -> {last:.4f} over {steps} steps ({elapsed:.2f} s)")
    if device.type == "neuron":
        torch.neuron.synchronize(device)
        print(f"  [{name}] device memory in use: {torch.neuron.memory_allocated(device) / 2**20:.1f} MiB "
              f"(model, gradients, optimizer state), peak {torch.neuron.max_memory_allocated(device) / 2**20:.1f} MiB")
    return first, last


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="neuron")
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; device {device}", end="")
    if device.type == "neuron":
        props = torch.neuron.get_device_properties(device)
        print(f" ({props.name}, {props.total_memory / 2**30:.0f} GiB HBM, "
              f"{torch.neuron.device_count()} NeuronCores visible)")
    else:
        print()

    results = {}
    print("MLP classifier")
    results["mlp"] = train("mlp", MLP(), classification_data(), nn.CrossEntropyLoss(), device, args.steps, 64)
    print("Transformer language model")
    results["transformer"] = train("lm", TinyTransformerLM(), language_data(), nn.CrossEntropyLoss(), device,
                                   args.steps, 32, flatten_logits=True)

    if device.type == "neuron":
        torch.neuron.synchronize()
        print(f"device memory after both runs: allocated {torch.neuron.memory_allocated() / 2**20:.1f} MiB, "
              f"peak {torch.neuron.max_memory_allocated() / 2**20:.1f} MiB, "
              f"reserved (cached) {torch.neuron.memory_reserved() / 2**20:.1f} MiB")
    ok = all(last < first and math.isfinite(last) for first, last in results.values())
    print("loss went down on every model" if ok else "LOSS DID NOT GO DOWN")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
