"""torch.optim on neuron: the same training run on CPU and neuron gives the same parameters."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx

DEV = torch.device("neuron")
STEPS = 5


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g)) for _ in range(n)]


OPTIMS = {
    "SGD": (torch.optim.SGD, dict(lr=0.1)),
    "SGD_momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2, dampening=0.1)),
    "SGD_nesterov": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True)),
    "Adam": (torch.optim.Adam, dict(lr=1e-2)),
    "Adam_amsgrad_wd": (torch.optim.Adam, dict(lr=1e-2, amsgrad=True, weight_decay=0.1)),
    "AdamW": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.05)),
    "AdamW_amsgrad": (torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
    "Adamax": (torch.optim.Adamax, dict(lr=1e-2, weight_decay=1e-2)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=1e-3)),
    "Adadelta": (torch.optim.Adadelta, dict(lr=1.0, rho=0.8)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=1e-2)),
    "RMSprop_centered_momentum": (torch.optim.RMSprop, dict(lr=1e-2, centered=True, momentum=0.5)),
    "Rprop": (torch.optim.Rprop, dict(lr=1e-2)),
    "NAdam": (torch.optim.NAdam, dict(lr=1e-2)),
    "NAdam_decoupled": (torch.optim.NAdam, dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True)),
    "RAdam": (torch.optim.RAdam, dict(lr=1e-2)),
    "ASGD": (torch.optim.ASGD, dict(lr=1e-2, t0=2)),
}

FUSED_ON_CPU = {"SGD", "SGD_momentum", "SGD_nesterov", "Adam", "Adam_amsgrad_wd", "AdamW", "AdamW_amsgrad", "Adagrad"}

CASES = [(name, "for_loop") for name in OPTIMS] + [(name, "foreach") for name in OPTIMS] + \
        [(name, "fused") for name in sorted(FUSED_ON_CPU)]


def train(device, opt_cls, kwargs, steps=STEPS):
    model = make_model().to(device)
    opt = opt_cls(model.parameters(), **kwargs)
    losses = []
    for x, y in batches(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return model, opt, torch.stack(losses)


def assert_params_close(dev_model, cpu_model, atol=1e-6, rtol=1e-5):
    for (n, pd), (_, pc) in zip(dev_model.named_parameters(), cpu_model.named_parameters()):
        assert pd.device.type == "neuron", n
        torch.testing.assert_close(pd.detach().cpu(), pc.detach().cpu(), atol=atol, rtol=rtol, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("name,form", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_optimizer_matches_cpu(name, form):
    cls, kw = OPTIMS[name]
    kw = dict(kw)
    if form == "foreach":
        kw["foreach"] = True
    elif form == "fused":
        kw["fused"] = True
    else:
        kw["foreach"] = False
    cpu_model, cpu_opt, cpu_losses = train("cpu", cls, kw)
    dev_model, dev_opt, dev_losses = train(DEV, cls, kw)
    torch.testing.assert_close(dev_losses.cpu(), cpu_losses, atol=1e-6, rtol=1e-5)
    assert_params_close(dev_model, cpu_model)
    # parameters moved from their initial values
    init = make_model()
    assert any(not torch.equal(p.detach().cpu(), q) for p, q in zip(dev_model.parameters(), init.parameters()))
    # optimizer state lives on neuron and equals CPU's
    for pd, pc in zip(dev_model.parameters(), cpu_model.parameters()):
        sd, sc = dev_opt.state[pd], cpu_opt.state[pc]
        assert sd.keys() == sc.keys()
        for k in sc:
            if isinstance(sc[k], torch.Tensor):
                if sc[k].dim() > 0:  # 0-dim counters (step, mu_product) stay on the host unless capturable/fused
                    assert sd[k].device.type == "neuron", (k, sd[k].device)
                torch.testing.assert_close(sd[k].cpu(), sc[k], atol=1e-6, rtol=1e-5)
            else:
                assert sd[k] == sc[k]


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD_momentum"])
def test_foreach_and_fused_match_for_loop_on_neuron(name):
    cls, kw = OPTIMS[name]
    ref, _, _ = train(DEV, cls, dict(kw, foreach=False))
    fe, _, _ = train(DEV, cls, dict(kw, foreach=True))
    fu, _, _ = train(DEV, cls, dict(kw, fused=True))
    assert_params_close(fe, ref, atol=1e-6, rtol=1e-5)
    assert_params_close(fu, ref, atol=1e-6, rtol=1e-5)


def test_fused_adamw_kernel_runs_on_neuron():
    model = make_model().to(DEV)
    cpu_model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    torch.neuron.synchronize()
    torch_neuronx.reset_metrics()
    for x, y in batches(3):
        for m, o, dev in ((model, opt, DEV), (cpu_model, cpu_opt, "cpu")):
            o.zero_grad()
            F.cross_entropy(m(x.to(dev)), y.to(dev)).backward()
            o.step()
    ops = torch_neuronx.metrics()["ops"]
    calls = sum(sum(v.values()) for k, v in ops.items() if k.startswith("aten::_fused_adamw_"))
    assert calls == 3, {k: v for k, v in ops.items() if "adam" in k}
    assert_params_close(model, cpu_model)


def test_fused_adamw_direct_call():
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(4, 3, generator=g), torch.randn(5, generator=g)]
    grads = [torch.randn_like(p) for p in params]
    exp_avgs = [torch.randn_like(p) * 0.1 for p in params]
    exp_avg_sqs = [torch.rand_like(p) * 0.1 for p in params]
    steps = [torch.tensor(3.0) for _ in params]

    def run(device):
        ps = [p.to(device) for p in params]
        ea = [e.to(device) for e in exp_avgs]
        es = [e.to(device) for e in exp_avg_sqs]
        st = [s.to(device) for s in steps]
        torch._fused_adamw_(ps, [gr.to(device) for gr in grads], ea, es, [], st, lr=1e-2, beta1=0.9, beta2=0.99,
                            weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
        return ps + ea + es

    for d, c in zip(run(DEV), run("cpu")):
        assert d.device.type == "neuron"
        torch.testing.assert_close(d.cpu(), c, atol=0, rtol=0)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs(line_search):
    results = []
    for device in ("cpu", DEV):
        model = make_model().to(device)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=4, line_search_fn=line_search)
        x, y = batches(1)[0]
        x, y = x.to(device), y.to(device)

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        losses = [float(opt.step(closure)) for _ in range(3)]
        results.append((model, losses))
    (cpu_model, cpu_losses), (dev_model, dev_losses) = results
    assert dev_losses == pytest.approx(cpu_losses, rel=1e-5, abs=1e-6)
    assert cpu_losses[-1] < cpu_losses[0]
    assert_params_close(dev_model, cpu_model, atol=1e-5, rtol=1e-4)


def train_on_both(make_opt, steps=3):
    """The same model and batches trained on CPU and on neuron; returns (cpu_model, neuron_model)."""
    out = []
    for device in ("cpu", DEV):
        model = make_model().to(device)
        opt = make_opt(model)
        for x, y in batches(steps):
            opt.zero_grad()
            F.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
        out.append(model)
    return out


def test_param_groups_and_maximize():
    cpu, dev = train_on_both(lambda m: torch.optim.Adam(
        [{"params": m[0].parameters(), "lr": 1e-3}, {"params": m[2].parameters(), "lr": 5e-2, "maximize": True}],
        foreach=False))
    assert_params_close(dev, cpu)


SCHEDULERS = {
    "StepLR": lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[1, 3], gamma=0.3),
    "ExponentialLR": lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.8),
    "CosineAnnealingLR": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=4),
    "OneCycleLR": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=STEPS + 1),
    "LambdaLR": lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda e: 1.0 / (e + 1)),
    "LinearLR": lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.2, total_iters=3),
    "CyclicLR": lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=2),
    "SequentialLR": lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.ConstantLR(o, factor=0.5, total_iters=2),
            torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)], milestones=[2]),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_lr_scheduler(name):
    results = []
    for device in ("cpu", DEV):
        model = make_model().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sched = SCHEDULERS[name](opt)
        lrs = []
        for x, y in batches():
            opt.zero_grad()
            F.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
            sched.step()
            lrs.append(sched.get_last_lr()[0])
        results.append((model, lrs))
    (cpu_model, cpu_lrs), (dev_model, dev_lrs) = results
    assert dev_lrs == cpu_lrs
    assert len(set(cpu_lrs)) > 1  # the schedule actually changed the lr
    assert_params_close(dev_model, cpu_model)


def test_reduce_lr_on_plateau_with_neuron_metric():
    model = make_model().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0)
    sched.step(torch.tensor(1.0, device=DEV))
    sched.step(torch.tensor(2.0, device=DEV))  # worse: reduce
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    sched.step(torch.tensor(0.5, device=DEV))  # better: keep
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_tensor_lr_on_neuron():
    cpu, dev = train_on_both(lambda m: torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01), foreach=False))
    assert_params_close(dev, cpu)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none):
    model = make_model().to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batches(1)[0]
    F.cross_entropy(model(x.to(DEV)), y.to(DEV)).backward()
    assert all(p.grad is not None and int(p.grad.count_nonzero()) > 0 for p in model.parameters())
    opt.zero_grad(set_to_none=set_to_none)
    for p in model.parameters():
        if set_to_none:
            assert p.grad is None
        else:
            assert p.grad is not None and p.grad.device.type == "neuron"
            assert torch.equal(p.grad.cpu(), torch.zeros_like(p.grad.cpu()))
    # training still works after zero_grad, and matches CPU
    cpu_model = make_model()
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    F.cross_entropy(cpu_model(x), y).backward()
    cpu_opt.zero_grad(set_to_none=set_to_none)
    for m, o, d in ((model, opt, DEV), (cpu_model, cpu_opt, "cpu")):
        F.cross_entropy(m(x.to(d)), y.to(d)).backward()
        o.step()
    assert_params_close(model, cpu_model)


def test_optimizer_state_dict_roundtrip_across_devices():
    cls, kw = OPTIMS["AdamW"]
    model_d, opt_d, _ = train(DEV, cls, dict(kw, foreach=False), steps=2)
    # continue on CPU from the neuron state, and on neuron: same result
    sd = copy.deepcopy(opt_d.state_dict())
    model_c = make_model()
    model_c.load_state_dict({k: v.cpu() for k, v in model_d.state_dict().items()})
    opt_c = cls(model_c.parameters(), **dict(kw, foreach=False))
    opt_c.load_state_dict(sd)  # state tensors are cast to the parameters' device
    for s in opt_c.state.values():
        assert s["exp_avg"].device.type == "cpu"
    for x, y in batches(2):
        for m, o, d in ((model_d, opt_d, DEV), (model_c, opt_c, "cpu")):
            o.zero_grad()
            F.cross_entropy(m(x.to(d)), y.to(d)).backward()
            o.step()
    assert_params_close(model_d, model_c)


CAPTURABLE = ["Adam", "AdamW", "Adamax", "Adadelta", "RMSprop", "Rprop", "NAdam", "RAdam", "ASGD"]


@pytest.mark.parametrize("foreach", [False, True], ids=["for_loop", "foreach"])
@pytest.mark.parametrize("name", CAPTURABLE)
def test_capturable_on_neuron_matches_cpu(name, foreach):
    # capturable=True keeps step counters on the device (CPU does not support it: compare with CPU's default)
    cls, kw = OPTIMS[name]
    cpu_model, _, _ = train("cpu", cls, dict(kw, foreach=foreach))
    dev_model, dev_opt, _ = train(DEV, cls, dict(kw, foreach=foreach, capturable=True))
    assert_params_close(dev_model, cpu_model)
    for st in dev_opt.state.values():
        assert st["step"].device.type == "neuron"
        assert float(st["step"]) == STEPS


@pytest.mark.parametrize("name", ["SGD_momentum", "Adam", "AdamW", "RMSprop", "Adagrad"])
def test_complex_parameters(name):
    cls, kw = OPTIMS[name]
    g = torch.Generator().manual_seed(5)
    p0 = torch.randn(4, 3, dtype=torch.complex64, generator=g)
    target = torch.randn(4, 3, dtype=torch.complex64, generator=g)
    out = []
    for device in ("cpu", DEV):
        p = p0.clone().to(device).requires_grad_()
        opt = cls([p], **dict(kw, foreach=False))
        for _ in range(STEPS):
            opt.zero_grad()
            (p - target.to(device)).abs().pow(2).sum().backward()
            opt.step()
        out.append(p.detach().cpu())
    torch.testing.assert_close(out[1], out[0], atol=1e-6, rtol=1e-5)
    assert not torch.equal(out[1], p0)
