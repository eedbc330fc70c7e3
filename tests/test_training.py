"""The seed loop of the one-line device switch: the models of examples/train.py trained for
several steps on neuron match the same run on CPU (same seed, same data, DataLoader with
pinned memory)."""

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from torch_neuronx.testing import models as train  # the models and data of examples/train.py


def run(device, make_model, dataset, batch_size, steps, flatten):
    torch.manual_seed(0)
    model = make_model().to(device)
    # Dropout draws from the default generator of the device it runs on: reseed
    # after the (CPU) initialization so both runs start their streams equal.
    torch.manual_seed(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, pin_memory=(device == "neuron"),
                        generator=torch.Generator().manual_seed(1), drop_last=True)
    losses = []
    for step, (batch, targets) in enumerate(loader):
        if step == steps:
            break
        if device == "neuron":
            assert batch.is_pinned()
        batch, targets = batch.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        optimizer.zero_grad()
        out = model(batch)
        if flatten:
            out, targets = out.reshape(-1, out.shape[-1]), targets.reshape(-1)
        loss = nn.functional.cross_entropy(out, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_training_matches_cpu(name):
    if name == "mlp":
        args = (train.MLP, train.classification_data(512), 64, 6, False)
    else:
        args = (train.TinyTransformerLM, train.language_data(128), 16, 4, True)
    cpu_losses, cpu_state = run("cpu", *args)
    dev_losses, dev_state = run("neuron", *args)
    # Same kernels (ATen's CPU kernels) and the same random streams: equal within float noise.
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), rtol=1e-5, atol=1e-5)
    # Parameters: attention's key bias has a mathematically zero gradient, so its
    # Adam updates follow float noise (SDPA's CPU kernel and the math path round
    # differently); a bound well under one Adam step (lr=3e-3) still catches real errors.
    for k in cpu_state:
        torch.testing.assert_close(dev_state[k], cpu_state[k], rtol=1e-4, atol=5e-4, msg=lambda m: f"{k}: {m}")
    assert dev_losses[-1] < dev_losses[0]


def _bf16_autocast_losses(make_model, x, y, steps):
    """AdamW steps under bf16 autocast on CPU and on neuron from the same initial weights."""
    losses = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        model = make_model().to(device)
        model.eval()  # no dropout: both runs see the same function
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        xd, yd = x.to(device), y.to(device)
        out = []
        for _ in range(steps):
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(xd)
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), yd.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        assert logits.dtype == torch.bfloat16
        losses[device] = out
    assert losses["neuron"][-1] < losses["neuron"][0]
    return torch.tensor(losses["neuron"]), torch.tensor(losses["cpu"])


def test_bf16_autocast_transformer_training_matches_cpu_autocast():
    # CPU autocast's policy differs from CUDA's (which neuron follows) in a few ops; for this
    # model the losses agree to 1e-3.
    data = train.language_data(n=64)
    dev, cpu = _bf16_autocast_losses(train.TinyTransformerLM, data.tensors[0][:16], data.tensors[1][:16], 6)
    torch.testing.assert_close(dev, cpu, rtol=1e-3, atol=1e-3)


def test_bf16_autocast_nanogpt_training_matches_cpu_autocast():
    """The benchmark's nanoGPT decoder (small config), 5 AdamW steps under bf16 autocast."""
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(0, 512, (4, 64), generator=g), torch.randint(0, 512, (4, 64), generator=g)
    dev, cpu = _bf16_autocast_losses(lambda: train.NanoGPT(vocab=512, d=64, layers=2, heads=4, seq=64), x, y, 5)
    torch.testing.assert_close(dev, cpu, rtol=2e-3, atol=2e-3)
