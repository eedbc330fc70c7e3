"""Checks of one ModuleInfo at one dtype: each module input's forward and backward on neuron
against the same module (same initial parameters) on CPU, in training and eval mode."""
import warnings

import torch

from .compare import DEVICE, assert_same, memoized, tensors_of, to_device, tree_map
from .op_checks import SEED, _differentiable_outputs, _skip


def module_key(info):
    return info.module_cls.__name__


def _build(info, mi, dtype, training, device):
    args, kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = info.module_cls(*args, **kwargs)
    m = m.to(device).to(dtype)
    m.train(training)
    return m


def _forward(info, mi, dtype, training, device):
    m = _build(info, mi, dtype, training, device)
    fa, fk = mi.forward_input.args, mi.forward_input.kwargs
    if device == DEVICE:
        move = memoized(to_device)
        fa, fk = tree_map(move, fa), tree_map(move, fk)
    torch.manual_seed(SEED + 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = m(*fa, **fk)
    return m, (fa, fk), out


def check_module_forward(info, mi, dtype, training):
    _, _, cpu = _forward(info, mi, dtype, training, "cpu")
    _, _, dev = _forward(info, mi, dtype, training, DEVICE)
    torch.neuron.synchronize()
    return assert_same(dev, cpu, "output", check_strides=False), None


def _module_grads(info, mi, dtype, training, device):
    m, fin, out = _forward(info, mi, dtype, training, device)
    outs = _differentiable_outputs(out)
    wrt = [p for p in m.parameters() if p.requires_grad]
    wrt += [t for t in tensors_of(fin) if t.requires_grad]
    if not outs or not wrt:
        return None
    g = torch.Generator().manual_seed(SEED + 1)
    gos = [torch.randn(o.shape, dtype=o.dtype, generator=g).to(device) for o in outs]
    grads = torch.autograd.grad(outs, wrt, gos, allow_unused=True)
    if device == DEVICE:
        torch.neuron.synchronize()
    return list(grads)


def check_module_backward(info, mi, dtype, training):
    cpu = _module_grads(info, mi, dtype, training, "cpu")
    if cpu is None:
        _skip("no differentiable output, parameter or input")
    dev = _module_grads(info, mi, dtype, training, DEVICE)
    return assert_same(dev, cpu, "grad", check_strides=False), None


def cases(info, dtype, max_samples=None):
    key = module_key(info)
    dt = str(dtype).replace("torch.", "")
    for training in ((True, False) if info.train_and_eval_differ else (True,)):
        mode = "train" if training else "eval"
        torch.manual_seed(SEED)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True,
                                             training=training)
        inputs = [mi for mi in inputs if mi.forward_input is not None]
        for i, mi in enumerate(inputs[:max_samples]):
            yield (f"{key}|{dt}|forward_{mode}|{i}", "module_forward",
                   (lambda mi=mi, t=training: check_module_forward(info, mi, dtype, t)))
            yield (f"{key}|{dt}|backward_{mode}|{i}", "module_backward",
                   (lambda mi=mi, t=training: check_module_backward(info, mi, dtype, t)))
