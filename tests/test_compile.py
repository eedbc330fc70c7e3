"""torch.compile on neuron (issue 5, first part): the Dynamo backend 'neuron', the C++ compiler's
executables against eager on a model suite (outputs, gradients, training losses), fusion, dynamic
shapes, recompiles, the on-disk kernel cache, debug dumps and modes."""
import copy
import json
import math
import os
import pathlib
import stat
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_neuronx  # noqa: F401
from helpers import compiled_tier_test
from torch_neuronx.compile import compile_metrics, reset_compile_metrics

from torch_neuronx.testing.models import BertEncoder, NanoGPT, ResNet18

ROOT = pathlib.Path(__file__).resolve().parents[1]

JOB = ROOT / "tests" / "compile" / "cache_job.py"


@pytest.fixture(autouse=True)
def fresh(tmp_path_factory, monkeypatch, request):
    # Every test here is about the compiled tier: a graph that fell back to eager is a failure
    # unless the test says it is about that.
    yield from compiled_tier_test(tmp_path_factory, monkeypatch, request)


class TinyNet(nn.Module):
    # (torch.compile skips the top frame of torch.nn's own modules, e.g. a bare nn.Linear.)
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return self.lin(x).relu() * 2


def chain(x, y):
    return torch.sigmoid(x * 2 + y).tanh() * torch.exp(-x) + torch.relu(y - 0.5)


def test_backend_by_name_and_as_default():
    assert "neuron" in torch._dynamo.list_backends()
    prev = torch.compiler.get_default_backend()
    torch.compiler.set_default_backend("neuron")
    try:
        m = TinyNet().to("neuron")
        ref = copy.deepcopy(m).cpu()
        assert m.compile() is None  # no backend argument
        x = torch.randn(3, 8)
        torch.testing.assert_close(m(x.to("neuron")).cpu(), ref(x))
    finally:
        torch.compiler.set_default_backend(prev)
    assert compile_metrics()["compiles"] >= 1
    assert torch_neuronx.metrics()["compile"]["compiles"] == compile_metrics()["compiles"]


def test_pointwise_chain_is_fused_and_equals_eager():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(300, 301, generator=g), torch.randn(300, 301, generator=g)
    out = torch.compile(chain, backend="neuron", fullgraph=True)(x.to("neuron"), y.to("neuron"))
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), chain(x, y), rtol=1e-5, atol=1e-6)
    m = compile_metrics()
    assert m["fused_groups"] == 1 and m["fused_nodes"] >= 9 and m["library_calls"] == {}
    xb, yb = x.bfloat16(), y.bfloat16()  # fused in float, stored as bfloat16
    outb = torch.compile(chain, backend="neuron")(xb.to("neuron"), yb.to("neuron")).cpu()
    assert outb.dtype == torch.bfloat16
    torch.testing.assert_close(outb.float(), chain(xb.float(), yb.float()), rtol=2e-2, atol=2e-2)


def ulps(got, exact, dtype):
    """|got - exact| in units of the last place of exact rounded to dtype."""
    r = exact.to(dtype).abs()
    spacing = (torch.nextafter(r, torch.tensor(math.inf, dtype=dtype)) - r).double()
    return (got.double() - exact).abs() / spacing


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_generated_tanh_is_within_a_few_ulp_of_the_exact_value_from_subnormals_to_overflow(dtype, tmp_path,
                                                                                          monkeypatch):
    # The generated kernels compute tanh themselves (codegen's prelude: a polynomial near 0 and
    # exp beyond it for float, expm1 for double), not with the vector library's tanh.
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(0)
    scales = (1e-30, 1e-6, 0.1, 0.3, 0.59, 0.6, 0.61, 1, 3, 9, 19, 30)
    v = torch.cat([torch.randn(1 << 15, generator=g, dtype=dtype) * s for s in scales] +
                  [torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 10.0, 1e30, -1e30],
                                dtype=dtype)])
    f = torch.compile(lambda v: torch.tanh(v * 2), backend="neuron", fullgraph=True)
    out = f(v.to("neuron")).cpu()
    m = compile_metrics()
    assert m["fused_groups"] == 1 and m["library_calls"] == {}, m
    src = next(p for p in tmp_path.iterdir() if p.name.endswith(".cpp")).read_text()
    body = src[src.index("nx_fused"):]
    assert "nx_vtanh(" in body and ".tanh()" not in body
    exact = torch.tanh((v * 2).double())  # (float64: its own rounding is far below the bound)
    finite = torch.isfinite(v)
    assert ulps(out[finite], exact[finite], dtype).max().item() <= 2.5
    assert out[-8:-6].tolist() == [1.0, -1.0] and math.isnan(out[-6])  # tanh(±inf), NaN
    assert out[-3:].tolist() == [1.0, 1.0, -1.0]
    assert torch.equal(f((-v).to("neuron")).cpu()[finite], -out[finite])  # odd, bit for bit


BROADCASTS = {  # name: (function, operand shapes); the first operand has the group's shape
    "bias_vector": (lambda x, b: torch.tanh(x + b) * 2, [(4, 8, 33, 65), (65,)]),
    "per_row": (lambda x, c: torch.exp(x - c) * 3, [(4, 8, 33, 65), (4, 8, 33, 1)]),
    "leading_dims": (lambda x, m, c: (x * m + c).sigmoid() - 1, [(4, 8, 33, 65), (4, 1, 1, 65), (4, 8, 33, 1)]),
    "zero_dim": (lambda x, s: (x * s).relu() + 1, [(4, 8, 33, 65), ()]),
    "outer_product": (lambda a, b: (a + b).exp() * 2, [(5, 1), (1, 7)]),
}


@pytest.mark.parametrize("case", sorted(BROADCASTS))
def test_broadcast_operands_fuse_into_one_loop(case):
    fn, shapes = BROADCASTS[case]
    g = torch.Generator().manual_seed(3)
    args = [torch.randn(s, generator=g) for s in shapes]
    out = torch.compile(fn, backend="neuron", fullgraph=True)(*(a.to("neuron") for a in args))
    torch.testing.assert_close(out.cpu(), fn(*args), rtol=1e-5, atol=1e-5)
    m = compile_metrics()
    assert m["fused_groups"] == 1 and m["library_calls"] == {}, m


def test_attention_mask_and_softmax_fuse_and_a_non_broadcastable_runtime_operand_falls_back():
    g = torch.Generator().manual_seed(4)
    scores, mask = torch.randn(2, 4, 16, 16, generator=g), torch.randn(2, 1, 1, 16, generator=g)
    fn = lambda s, m: torch.softmax(s * 0.125 + m, -1)  # noqa: E731
    f = torch.compile(fn, backend="neuron", dynamic=False)
    torch.testing.assert_close(f(scores.to("neuron"), mask.to("neuron")).cpu(), fn(scores, mask))
    assert compile_metrics()["fused_row_groups"] == 1
    wide = mask.expand(2, 1, 16, 16).transpose(2, 3)  # the same values, read through a view
    torch.testing.assert_close(f(scores.to("neuron"), wide.to("neuron")).cpu(), fn(scores, wide))


def test_non_dense_operands_of_a_fused_group_fall_back_to_library_calls():
    f = torch.compile(lambda a, b: (a * 2 + b).exp(), backend="neuron", dynamic=False)
    a = torch.randn(8, 6)
    b = torch.randn(6, 8)
    out = f(a.to("neuron"), b.to("neuron").t())  # a transposed operand
    torch.testing.assert_close(out.cpu(), (a * 2 + b.t()).exp())


def test_intermediates_share_one_planned_arena():
    # Eight matmuls in a row: each result lives until the next one is computed, so two buffers'
    # worth of arena serve all of them; the library calls write there (and the result straight
    # into the returned tensor) through their out= overloads.
    def stack(x, ws):
        for w in ws:
            x = torch.tanh(x @ w)
        return x

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=g)
    ws = [torch.randn(64, 64, generator=g) / 8 for _ in range(8)]
    out = torch.compile(stack, backend="neuron", fullgraph=True)(x.to("neuron"), [w.to("neuron") for w in ws])
    torch.testing.assert_close(out.cpu(), stack(x, ws), rtol=1e-5, atol=1e-5)
    m = compile_metrics()
    assert m["out_calls"] >= 8 and m["planned_values"] >= 14, m
    assert 0 < m["arena_bytes"] <= 2 * 64 * 64 * 4 < m["planned_bytes"], m


def test_views_of_views_are_simplified_and_constants_folded():
    def f(x):
        pos = torch.arange(8, device=x.device).float()  # constants only: folded when built
        w = torch.ones(8, device=x.device) * 2
        p = x.permute(1, 0, 2).permute(2, 1, 0)  # one permute of x
        return p.reshape(8, 3) * (pos * w)[:, None] + x.reshape(2, 12).reshape(8, 3)

    x = torch.randn(3, 1, 8)
    f_c = torch.compile(f, backend="neuron", fullgraph=True)
    for _ in range(2):  # the folded constants are bound again at every launch
        torch.testing.assert_close(f_c(x.to("neuron")).cpu(), f(x))
    m = compile_metrics()
    assert m["views_simplified"] >= 2 and m["constants_folded"] >= 2, m
    assert "aten::arange.start_step" not in m["library_calls"], m["library_calls"]


def test_out_overload_that_resizes_its_output_falls_back_to_allocating():
    # mse_loss's out= kernel uses `out` as elementwise scratch before reducing into it.
    f = torch.compile(lambda a, b: F.mse_loss(a, b) * 2, backend="neuron")
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    for _ in range(2):  # the second launch goes straight to the allocating call
        torch.testing.assert_close(f(a.to("neuron"), b.to("neuron")).cpu(), F.mse_loss(a, b) * 2)


def _train(model, data, target, loss_fn, steps, compiled, memory_format=None):
    model = copy.deepcopy(model)
    if memory_format is not None:
        model, data = model.to(memory_format=memory_format), data.contiguous(memory_format=memory_format)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fwd = torch.compile(model, backend="neuron") if compiled else model
    losses = []
    for _ in range(steps):
        loss = loss_fn(fwd(data), target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, model


def _ce(logits, t):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))


def _tokens(n, vocab, seq, seed):
    return torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(seed))


SUITE = {
    "mlp": (lambda: nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 5)),
            lambda: (torch.randn(8, 16), torch.randint(0, 5, (8,))), F.cross_entropy),
    "cnn_batchnorm": (lambda: ResNet18(classes=5, width=8),
                      lambda: (torch.randn(4, 3, 64, 64), torch.randint(0, 5, (4,))), F.cross_entropy),
    "nanogpt": (lambda: NanoGPT(vocab=96, d=32, layers=2, heads=4, seq=16),
                lambda: (_tokens(2, 96, 16, 1), _tokens(2, 96, 16, 2)), _ce),
}


@pytest.mark.parametrize("name", list(SUITE))
def test_training_matches_eager_for_20_steps(name):
    make, data, loss_fn = SUITE[name]
    torch.manual_seed(0)
    model = make().to("neuron")
    x, t = (v.to("neuron") for v in data())
    # The compiler runs convolution graphs channels-last; a BN net at batch 2 amplifies the
    # layout's different summation order within a few steps (CPU alone does), so the eager
    # reference runs the same layout.
    eager, m_eager = _train(model, x, t, loss_fn, 20, compiled=False,
                            memory_format=torch.channels_last if name == "cnn_batchnorm" else None)
    compiled, m_comp = _train(model, x, t, loss_fn, 20, compiled=True)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-4)
    for (n, a), b in zip(m_comp.state_dict().items(), m_eager.state_dict().values()):
        a, b = a.cpu(), b.cpu()
        if n.endswith("qkv.bias"):
            # The key bias's gradient is zero in exact arithmetic (softmax ignores a constant per
            # row), so AdamW's normalized step follows rounding noise: up to lr per step.
            d = a.shape[0] // 3
            torch.testing.assert_close(a[d:2 * d], b[d:2 * d], rtol=0, atol=1e-3 * 20, msg=n)
            a, b = torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]])
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=n)  # incl. BN running stats
    m = compile_metrics()
    assert m["compiles"] >= 2 and m["recompiles"] == 0 and m["eager_graphs"] == 0  # forward + backward


def test_transformer_block_with_sdpa_gradients_match_eager():
    torch.manual_seed(0)
    block = NanoGPT(vocab=64, d=32, layers=1, heads=4, seq=8).blocks[0].to("neuron")
    x = torch.randn(2, 8, 32, device="neuron", requires_grad=True)
    ref = block(x)
    ref.square().mean().backward()
    grads = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad()
    x.grad = None
    out = torch.compile(block, backend="neuron", fullgraph=True)(x)
    out.square().mean().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip([p.grad for p in block.parameters()] + [x.grad], grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert any("attention" in k for k in compile_metrics()["library_calls"])


ROW_CASES = {
    "softmax_prologue": lambda x, y, w, b: torch.softmax(x * 0.5 + y, -1),
    "log_softmax_prologue": lambda x, y, w, b: torch.log_softmax(x - y * 2, dim=2),
    "softmax_epilogue": lambda x, y, w, b: torch.softmax(x, -1) * y + 1,
    "layer_norm_both": lambda x, y, w, b: F.gelu(F.layer_norm(x + y, (300,), w, b)) * 2,
    "layer_norm_no_affine": lambda x, y, w, b: F.layer_norm(x - y, (300,)),
    "layer_norm_input_used_after": lambda x, y, w, b: (F.layer_norm(x + y, (300,), w, b), x + y),
}


def _row_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for shape in ((6, 37, 300), (6, 37, 300), (300,), (300,))]


@pytest.mark.parametrize("case", sorted(ROW_CASES))
def test_row_reductions_fuse_with_their_pointwise_neighbours(case):
    fn = ROW_CASES[case]
    args = _row_inputs()
    out = torch.compile(fn, backend="neuron", fullgraph=True)(*(a.to("neuron") for a in args))
    want = fn(*args)
    for o, r in zip(out if isinstance(out, tuple) else (out,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-5)
    m = compile_metrics()
    assert m["fused_row_groups"] == 1 and m["library_calls"] == {}, m


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "prologue"])
def test_cross_entropy_fuses_log_softmax_and_the_target_gather(reduction, scaled):
    g = torch.Generator().manual_seed(5)
    logits, target = torch.randn(37, 300, generator=g), torch.randint(0, 300, (37,), generator=g)
    target[[3, 20]] = -100  # ignore_index rows count neither loss nor weight

    def f(x, t):
        return F.cross_entropy(x * 0.5 + 1 if scaled else x, t, reduction=reduction)

    out = torch.compile(f, backend="neuron", fullgraph=True)(logits.to("neuron"), target.to("neuron"))
    torch.testing.assert_close(out.cpu(), f(logits, target), rtol=1e-5, atol=1e-5)
    m = compile_metrics()
    assert m["fused_row_groups"] == 1 and m["library_calls"] == {}, m


def test_fused_cross_entropy_raises_on_a_target_out_of_range_and_counts_no_rows_as_nan():
    f = torch.compile(lambda x, t: F.cross_entropy(x, t), backend="neuron", dynamic=False)
    x = torch.randn(4, 10)
    with pytest.raises(IndexError, match="Target 10 is out of bounds"):
        f(x.to("neuron"), torch.tensor([1, 10, 2, 3]).to("neuron")).cpu()
    torch.neuron.synchronize()  # the device is usable again
    all_ignored = torch.full((4,), -100)
    torch.testing.assert_close(f(x.to("neuron"), all_ignored.to("neuron")).cpu(), F.cross_entropy(x, all_ignored),
                               equal_nan=True)


def test_training_with_the_loss_inside_the_compiled_graph_matches_eager():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 50))
    model = copy.deepcopy(ref).to("neuron")
    x, t = torch.randn(16, 32), torch.randint(0, 50, (16,))
    step = lambda m, x, t: F.cross_entropy(m(x), t)  # noqa: E731
    step(ref, x, t).backward()
    loss = torch.compile(step, backend="neuron")(model, x.to("neuron"), t.to("neuron"))
    loss.backward()
    torch.testing.assert_close(loss.cpu(), F.cross_entropy(ref(x), t))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5)
    assert compile_metrics()["fused_row_groups"] >= 1


def test_row_group_special_values_match_eager():
    x, y, _, _ = _row_inputs(1)
    x[0, 0, 3], x[2, 2, 2] = float("inf"), float("nan")
    x[1, 1, :] = float("-inf")  # a row of -inf: 0/0
    for fn in (lambda x, y: torch.softmax(x + y, -1), lambda x, y: torch.log_softmax(x + y, -1)):
        torch._dynamo.reset()
        out = torch.compile(fn, backend="neuron")(x.to("neuron"), y.to("neuron")).cpu()
        torch.testing.assert_close(out, fn(x, y), equal_nan=True)


def test_row_group_layer_norm_gradients_match_eager():
    x, y, w, _ = _row_inputs(2)
    f = lambda x, y, w: F.layer_norm(x * 2 + y, (300,), w).square().sum()  # noqa: E731
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    xn, wn = x.to("neuron").requires_grad_(), w.to("neuron").requires_grad_()
    f(xc, y, wc).backward()
    torch.compile(f, backend="neuron")(xn, y.to("neuron"), wn).backward()  # backward reads mean, rstd
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wn.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-3)
    assert compile_metrics()["fused_row_groups"] >= 1


def test_row_group_with_a_non_dense_operand_runs_its_ops_as_library_calls():
    f = torch.compile(lambda a, b: torch.softmax(a * 2 + b, -1), backend="neuron", dynamic=False)
    a, b = torch.randn(8, 6), torch.randn(6, 8)
    out = f(a.to("neuron"), b.to("neuron").t())  # a transposed operand
    torch.testing.assert_close(out.cpu(), torch.softmax(a * 2 + b.t(), -1))


# 128 x 256 x 2048 multiply-adds: the smallest GEMM the compiler gives to oneDNN.
GEMM = dict(rows=128, inner=256, cols=2048)
EPILOGUES = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "silu": F.silu,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid,
}


def _linear_inputs(batch_dims=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = GEMM["rows"] // math.prod(batch_dims)
    x = torch.randn(*batch_dims, rows, GEMM["inner"], generator=g)
    w = torch.randn(GEMM["cols"], GEMM["inner"], generator=g) / 16
    b = torch.randn(GEMM["cols"], generator=g)
    r = torch.randn(*batch_dims, rows, GEMM["cols"], generator=g)
    return x, w, b, r


@pytest.mark.parametrize("act", sorted(EPILOGUES))
@pytest.mark.parametrize("batch_dims", [(), (2,)], ids=["2d", "3d"])
def test_gemm_activation_epilogue_runs_as_a_onednn_post_op(act, batch_dims):
    fn = EPILOGUES[act]
    x, w, b, _ = _linear_inputs(batch_dims)
    f = torch.compile(lambda x, w, b: fn(F.linear(x, w, b)), backend="neuron", fullgraph=True)
    out = f(*(t.to("neuron") for t in (x, w, b)))
    torch.testing.assert_close(out.cpu(), fn(F.linear(x, w, b)), rtol=1e-4, atol=1e-4)
    m = compile_metrics()
    assert m["gemms"] == 1 and m["epilogues"] == 1, m
    assert m["library_calls"].get("mkldnn::_linear_pointwise") == 1, m["library_calls"]
    assert not any(op.startswith(("aten::addmm", "aten::gelu", "aten::relu")) for op in m["library_calls"])


@pytest.mark.parametrize("batch_dims", [(), (4,)], ids=["2d", "3d"])
@pytest.mark.parametrize("residual_first", [False, True])
def test_gemm_residual_add_epilogue(batch_dims, residual_first):
    x, w, b, r = _linear_inputs(batch_dims, seed=1)

    def block(x, w, b, r):
        y = F.linear(x, w, b)
        return (r + y if residual_first else y + r) * 0.5

    out = torch.compile(block, backend="neuron", fullgraph=True)(*(t.to("neuron") for t in (x, w, b, r)))
    torch.testing.assert_close(out.cpu(), block(x, w, b, r), rtol=1e-4, atol=1e-4)
    m = compile_metrics()
    assert m["epilogues"] == 1 and m["library_calls"].get("mkldnn::_linear_pointwise.binary") == 1, m


@pytest.mark.parametrize("epilogue", ["relu", "silu", "residual"])
def test_convolution_epilogue_runs_as_a_onednn_post_op(epilogue):
    g = torch.Generator().manual_seed(4)  # an output of 2^16 elements: the smallest that takes the post-op
    x, w, b = torch.randn(2, 8, 64, 64, generator=g), torch.randn(32, 8, 3, 3, generator=g), torch.randn(32, generator=g)
    r = torch.randn(2, 32, 32, 32, generator=g)

    def f(x, w, b, r):
        y = F.conv2d(x, w, b, stride=2, padding=1)
        return (y + r if epilogue == "residual" else getattr(F, epilogue)(y)) * 0.5

    out = torch.compile(f, backend="neuron", fullgraph=True)(*(t.to("neuron") for t in (x, w, b, r)))
    torch.testing.assert_close(out.cpu(), f(x, w, b, r), rtol=1e-5, atol=1e-5)
    m = compile_metrics()
    assert m["convolutions"] == 1 and m["epilogues"] == 1, m
    assert "aten::convolution" not in m["library_calls"], m["library_calls"]


def test_channels_last_cnn_trains_as_eager():
    # model.to(memory_format=torch.channels_last), as CNN users write it: ATen's CPU convolution
    # returns channels-last results where the meta kernels traced for neuron promised contiguous
    # ones, and the flatten after the last convolution is a view traced on those promised strides.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 5))
    model = model.to("neuron", memory_format=torch.channels_last)
    x = torch.randn(4, 3, 32, 32).to("neuron", memory_format=torch.channels_last)
    t = torch.randint(0, 5, (4,)).to("neuron")
    eager, _ = _train(model, x, t, F.cross_entropy, 5, compiled=False)
    compiled, _ = _train(model, x, t, F.cross_entropy, 5, compiled=True)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-4, atol=1e-4)


def test_frozen_batch_norm_fine_tuning_matches_cpu():
    # Batch norm in eval mode inside a graph that needs gradients (fine-tuning with frozen
    # statistics): ATen's CPU kernel returns empty saved statistics where the graph was traced
    # with [C]; the executable gives the traced shape (the eval backward reads running stats).
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Conv2d(32, 16, 3, padding=1),
                        nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    for bn in (net[1], net[4]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    net.eval()
    dev = copy.deepcopy(net).to("neuron")
    x = torch.randn(8, 3, 32, 32)
    xc, xn = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    net(xc).square().sum().backward()
    torch.compile(dev, backend="neuron")(xn).square().sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(net.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4, msg=name)
    for a, b in zip(net.buffers(), dev.buffers()):
        assert torch.equal(a, b.cpu())  # eval: the running statistics stay as they were
    assert compile_metrics()["library_calls"].get("aten::_native_batch_norm_legit_no_training") == 2


def test_relu_backward_stays_one_kernel():
    # Decomposed, ReLU's backward is a comparison and a where over a bool mask: two passes that
    # no fused loop takes. Kept whole it is ATen's one threshold_backward kernel, as in eager.
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(3))
    xn = x.to("neuron").requires_grad_()
    f = torch.compile(lambda x: torch.relu(x * 2).sum(), backend="neuron")
    f(xn).backward()
    xc = x.clone().requires_grad_()
    torch.relu(xc * 2).sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)
    calls = compile_metrics()["library_calls"]
    assert calls.get("aten::threshold_backward") == 1 and "aten::where.self" not in calls, calls


def test_small_gemms_stay_on_aten():
    # Below 2^22 multiply-adds (or 32 rows) ATen's BLAS call beats oneDNN's per-call setup.
    g = torch.Generator().manual_seed(2)
    small = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    short = torch.randn(16, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    f = torch.compile(lambda a, b: torch.relu(a @ b), backend="neuron")
    for a, b in (small, short):
        torch.testing.assert_close(f(a.to("neuron"), b.to("neuron")).cpu(), torch.relu(a @ b), rtol=1e-4, atol=1e-4)
    m = compile_metrics()
    assert m["gemms"] == 0 and m["library_calls"].get("aten::mm") == 2, m


def test_a_column_major_left_operand_is_copied_row_major_for_onednn():
    # The backward's weight-gradient GEMMs read an activation transposed: oneDNN's matmul on a
    # row-major copy still beats ATen's BLAS call on it.
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(GEMM["inner"], GEMM["rows"], generator=g), torch.randn(GEMM["inner"], GEMM["cols"], generator=g)
    t = torch.compile(lambda a, b: torch.relu(a.t() @ b), backend="neuron")
    torch.testing.assert_close(t(a.to("neuron"), b.to("neuron")).cpu(), torch.relu(a.t() @ b), rtol=1e-4, atol=1e-4)
    m = compile_metrics()
    assert m["gemms"] == 1 and m["epilogues"] == 1 and m["library_calls"].get("aten::clone") == 1, m
    assert "aten::mm" not in m["library_calls"], m


def test_a_returned_gemm_result_runs_on_onednn():
    # oneDNN's op allocates its result, which is then copied into the returned buffer: the copy
    # costs less than oneDNN saves over ATen's BLAS call.
    x, w, b, _ = _linear_inputs()
    out = torch.compile(lambda x, w, b: F.linear(x, w, b), backend="neuron")(*(t.to("neuron") for t in (x, w, b)))
    torch.testing.assert_close(out.cpu(), F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    m = compile_metrics()
    assert m["gemms"] == 1 and "aten::addmm" not in m["library_calls"], m


def test_gemm_result_used_twice_keeps_its_epilogue_separate():
    x, w, b, _ = _linear_inputs()

    def f(x, w, b):
        h = F.linear(x, w, b)
        return F.gelu(h), h.sum()

    out = torch.compile(f, backend="neuron", fullgraph=True)(*(t.to("neuron") for t in (x, w, b)))
    for got, want in zip(out, f(x, w, b)):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-3)
    m = compile_metrics()
    assert m["gemms"] == 1 and m["epilogues"] == 0 and "aten::gelu" in m["library_calls"], m


def test_gemms_stay_on_aten_when_onednn_is_disabled():
    x, w, b, _ = _linear_inputs()
    with warnings.catch_warnings(), torch.backends.mkldnn.flags(enabled=False):
        warnings.simplefilter("ignore")  # (flags() also sets oneDNN's TF32 switch, with a warning)
        out = torch.compile(lambda x, w, b: F.relu(F.linear(x, w, b)), backend="neuron")(
            *(t.to("neuron") for t in (x, w, b)))
    torch.testing.assert_close(out.cpu(), F.relu(F.linear(x, w, b)), rtol=1e-4, atol=1e-4)
    assert compile_metrics()["gemms"] == 0


def test_training_through_onednn_gemms_matches_eager():
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(GEMM["inner"], GEMM["cols"]), nn.Linear(GEMM["cols"], GEMM["inner"])

        def forward(self, x):
            return x + self.down(F.gelu(self.up(x)))

    torch.manual_seed(0)
    ref = Mlp()
    model = copy.deepcopy(ref).to("neuron")
    x = torch.randn(2, GEMM["rows"] // 2, GEMM["inner"])
    ref(x).square().mean().backward()
    torch.compile(model, backend="neuron")(x.to("neuron")).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-5, msg=name)
    # The residual GEMM of the forward, the grad-input GEMM of the backward (the first GEMM's
    # result is saved for the backward, a graph output: ATen writes it in place).
    assert compile_metrics()["gemms"] >= 2


@pytest.mark.parametrize("norm_first,activation", [(False, "gelu"), (True, "relu")])
def test_transformer_encoder_fast_path_is_decomposed(norm_first, activation):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first).eval()
    x = torch.randn(2, 16, 64)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[1, 12:] = True
    dev = copy.deepcopy(layer).to("neuron")
    compiled = torch.compile(dev, backend="neuron")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x.to("neuron")).cpu(), layer(x), rtol=1e-4, atol=1e-5)
        assert "aten::_transformer_encoder_layer_fwd" not in compile_metrics()["library_calls"]
        # With a padding mask the fused op stays whole (the decomposition covers the unmasked form).
        got = compiled(x.to("neuron"), src_key_padding_mask=mask.to("neuron")).cpu()
        torch.testing.assert_close(got, layer(x, src_key_padding_mask=mask), rtol=1e-4, atol=1e-5)


def test_profiler_shows_the_steps_of_a_compiled_program():
    from torch.profiler import ProfilerActivity, profile

    x, w, b, _ = _linear_inputs()
    f = torch.compile(lambda x, w, b: torch.sigmoid(F.gelu(F.linear(x, w, b)) * 2 + 1), backend="neuron")
    args = [t.to("neuron") for t in (x, w, b)]
    f(*args)
    torch.neuron.synchronize()  # (a program running when the session starts is reported whole)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        f(*args).cpu()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1}
    assert {"mkldnn::_linear_pointwise", "neuron::fused_loop"} <= names, names
    assert "neuron::executable" not in names  # its steps stand for it


@pytest.mark.parametrize("ctx", ["no_grad", "inference_mode"])
def test_bert_sized_encoder_inference(ctx):
    torch.manual_seed(0)
    model = BertEncoder(vocab=128, d=32, layers=2, heads=4, ff=64, seq=16).to("neuron").eval()
    x = _tokens(2, 128, 16, 5).to("neuron")
    with getattr(torch, ctx)():
        ref = model(x)
        out = torch.compile(model, backend="neuron")(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_dynamic_shapes_are_runtime_sizes_not_recompiles():
    f = torch.compile(chain, backend="neuron", dynamic=True)
    for n in (5, 17, 64, 3):
        x, y = torch.randn(n, 7), torch.randn(n, 7)
        torch.testing.assert_close(f(x.to("neuron"), y.to("neuron")).cpu(), chain(x, y), rtol=1e-5, atol=1e-6)
    m = compile_metrics()
    assert m["compiles"] == 1 and m["recompiles"] == 0


def test_symbolic_size_arithmetic_is_evaluated_per_launch():
    # Floor division, modulo and products of symbols, and a scalar from sym_size: the size
    # expressions are bytecode resolved when the graph was built, evaluated on int64 at launch.
    def f(x):
        n = x.shape[0]
        halves = x[: (n // 2) * 2].reshape(n // 2, -1)
        tail = x[n - (n % 3 + 2):]  # n % 3 + 2 rows: never 0 or 1, so no contiguity guard
        return halves.sum(1) * n, tail.cos() + 1, x.new_ones(n * x.shape[1] // 3)

    g = torch.compile(f, backend="neuron", dynamic=True)
    for n in (7, 12, 31, 64):
        x = torch.randn(n, 6)
        got, want = g(x.to("neuron")), f(x)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-5)
    m = compile_metrics()
    assert m["compiles"] == 1 and m["recompiles"] == 0 and m["eager_graphs"] == 0, {k: m[k] for k in ("compiles", "recompiles", "recompile_reasons", "eager_reasons")}


def test_sym_sum_of_sizes_is_a_scalar_op_of_the_executable():
    # torch.sym_sum (Hugging Face's generate sums cache lengths with it) takes its terms as one
    # list; it is evaluated at launch like the other scalar ops, so the graph compiles.
    def f(a, b, c):
        n = torch.sym_sum([a.shape[0], b.shape[0], c.shape[0]])
        return torch.cat([a, b, c]).view(n, -1) * 2, torch.ones(n, device=a.device)

    g = torch.compile(f, backend="neuron", dynamic=True)
    for k in (10, 20):  # (no operand with 4 rows: duck sizing would tie it to the width)
        a, b, c = torch.randn(k, 4), torch.randn(k + 1, 4), torch.randn(2, 4)
        for got, want in zip(g(a.to("neuron"), b.to("neuron"), c.to("neuron")), f(a, b, c)):
            torch.testing.assert_close(got.cpu(), want)
    m = compile_metrics()
    assert m["compiles"] == 1 and m["eager_graphs"] == 0, (m["eager_reasons"], m["recompile_reasons"])


@pytest.mark.parametrize("tokens,message", [(["s:s9"], "unbound symbol s9"), (["i:2", "^"], r"unknown size expression operator \^"),
                                            (["i:2", "+"], "malformed size expression")])
def test_a_bad_size_expression_is_rejected_when_the_graph_is_built(tokens, message):
    from torch_neuronx import _C
    desc = {"values": [("x", "tensor", (torch.float32, [tokens], [["i:1"]]))], "inputs": [(0, True)],
            "symbols": [], "nodes": [], "outputs": [0]}
    with pytest.raises(RuntimeError, match=message):
        _C._compiler.compile(desc, "")


@pytest.mark.parametrize("dynamic", [True, None])
def test_changing_the_learning_rate_every_step_does_not_recompile(dynamic):
    # The learning rate is a runtime argument of the executable (a symbolic float). With
    # dynamic=True it is one from the first compile; by default Dynamo first specializes floats
    # and makes a float that changed dynamic once (its "automatic dynamic" recompile), then never again.
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    try:
        @torch.compile(backend="neuron", dynamic=dynamic)
        def sgd_step(w, g, lr):
            return w - lr * g

        w, g = torch.randn(10, device="neuron"), torch.randn(10, device="neuron")
        for step in range(8):
            lr = 0.1 / (step + 1)
            torch.testing.assert_close(sgd_step(w, g, lr), w - lr * g)
        m = compile_metrics()
        assert m["recompiles"] == (0 if dynamic else 1) and m["compiles"] == (1 if dynamic else 2)
    finally:
        torch._dynamo.config.fail_on_recompile_limit_hit = False


def test_recompiles_are_counted_with_reasons():
    f = torch.compile(chain, backend="neuron", dynamic=False)
    x = torch.randn(4, 4, device="neuron")
    f(x, x)
    f(x.double(), x.double())
    m = compile_metrics()
    assert m["recompiles"] == 1 and "dtype" in m["recompile_reasons"][0]


def test_graph_breaks_run_correctly():
    def f(x):
        y = x.sin() * 2
        print("", end="")  # a graph break
        return (y + 1).cos()

    x = torch.randn(16)
    torch.testing.assert_close(torch.compile(f, backend="neuron")(x.to("neuron")).cpu(), f(x), rtol=1e-5, atol=1e-6)
    assert compile_metrics()["compiles"] == 2


def test_autocast_bf16_compiled_matches_eager_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to("neuron")
    x = torch.randn(4, 16, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        ref = model(x)
        out = torch.compile(model, backend="neuron")(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_other_modes_are_accepted_with_a_warning():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = torch.compile(chain, backend="neuron", mode="max-autotune-no-cudagraphs")
        x = torch.randn(4, device="neuron")
        torch.testing.assert_close(f(x, x), chain(x, x))
    assert any("mode=" in str(m.message) for m in w)


def test_debug_dir_dumps_graph_ir_and_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NEURONX_DEBUG_DIR", str(tmp_path))
    x = torch.randn(8, device="neuron")
    torch.compile(chain, backend="neuron")(x, x)
    names = [p.name for p in tmp_path.iterdir()]
    assert any(n.startswith("fx_") for n in names)
    assert any(n.endswith(".ir_before.txt") for n in names) and any(n.endswith(".ir_after.txt") for n in names)
    src = next(p for p in tmp_path.iterdir() if p.name.endswith(".cpp")).read_text()
    assert "at::vec::Vectorized" in src and "fast-math" not in src


def _job(cache, extra_env=None):
    # (Inductor's caches on: a benchmark run in this environment may have turned them off.)
    env = {**os.environ, "TORCH_NEURONX_CACHE_DIR": str(cache), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0",
           **(extra_env or {})}
    return subprocess.Popen([sys.executable, str(JOB)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _result(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def test_disk_cache_warm_start_in_a_new_process(tmp_path):
    cache = tmp_path / "cache"
    cold, _ = _result(_job(cache))
    assert cold["kernels_built"] >= 1 and cold["cache_hits"] == 0
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # user-only
    assert cold["graph_cache_hits"] == 0
    assert stat.S_IMODE((cache / "graphs").stat().st_mode) == 0o700
    warm, _ = _result(_job(cache))
    assert warm["kernels_built"] == 0 and warm["cache_hits"] >= 1
    # The chain (inference), the MLP step (forward, backward) and the aliased outputs come from
    # AOTAutograd's cache: no tracing, partitioning or export in the new process.
    assert warm["graph_cache_hits"] == warm["compiles"] == 4, (cold, warm)


KEY_PROBE = """
import json, sys, torch, torch_neuronx
from torch._dynamo.utils import counters
from torch._inductor import codecache

calls = []
for owner, name in ((codecache, "torch_key"), (codecache, "init_backend_registration")):
    fn = getattr(owner, name)
    setattr(owner, name, lambda *a, _fn=fn, _n=name: (calls.append(_n), _fn(*a))[1])
get_system = codecache.CacheBase.get_system
codecache.CacheBase.get_system = staticmethod(lambda: (calls.append("get_system"), get_system())[1])

def f(x):
    return torch.nn.functional.gelu(x @ x.t()).sum(-1)

x = torch.randn(64, 64, device="neuron", requires_grad=True)
states = []
for setting in sys.argv[1:]:
    if setting == "deterministic":
        torch.use_deterministic_algorithms(True)
    elif setting == "tf32":
        torch.set_float32_matmul_precision("high")
    torch._dynamo.reset()
    before = dict(counters["aot_autograd"])
    out = torch.compile(f, backend="neuron")(x)
    out.sum().backward()
    states.append("hit" if counters["aot_autograd"]["autograd_cache_hit"] > before.get("autograd_cache_hit", 0)
                  else "miss" if counters["aot_autograd"]["autograd_cache_miss"] > before.get("autograd_cache_miss", 0)
                  else "bypass")
torch.testing.assert_close(out.cpu(), f(x.detach().cpu()), rtol=1e-4, atol=1e-4)
print(json.dumps({"states": states, "calls": calls}))
"""


def test_graph_cache_key_skips_inductors_code_generators_and_keeps_what_decides_a_graph(tmp_path):
    # The neuron backend's AOTAutograd key does not hash Inductor's sources or Triton, nor register
    # Inductor's code generators (~1 s of a warm start); what decides the graph still changes it.
    env = {**os.environ, "TORCH_NEURONX_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0"}
    r = subprocess.run([sys.executable, "-c", KEY_PROBE, "base", "base", "deterministic", "deterministic", "tf32"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["states"] == ["miss", "hit", "miss", "hit", "miss"], res
    assert res["calls"] == [], res


def test_a_training_step_loaded_from_the_graph_cache_regenerates_aliased_outputs(tmp_path):
    # ProphetNet's training graphs return views of intermediates. AOTAutograd regenerates them by
    # replaying recorded views, which read garbage sizes from a loaded cache entry: such graphs are
    # not written to the cache (they compile again), the others are.
    code = ("from torch_neuronx.hf_sweep.checks import Arch\n"
            "from torch_neuronx.compile import compile_metrics\n"
            "Arch('causal-lm', 'prophetnet', compiled=True).check_train()\n"
            "print(compile_metrics()['graph_cache_skips'])")
    env = {**os.environ, "TORCH_NEURONX_CACHE_DIR": str(tmp_path), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0"}
    for _ in range(2):  # cold, then from the cache
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert int(r.stdout.strip().splitlines()[-1]) >= 1  # not cached, compiled again


def test_graph_cache_is_bypassed_while_dumping_debug_files(tmp_path):
    cache = tmp_path / "cache"
    _result(_job(cache))
    debug = tmp_path / "debug"
    res, _ = _result(_job(cache, {"TORCH_NEURONX_DEBUG_DIR": str(debug)}))
    assert res["graph_cache_hits"] == 0 and any(p.name.startswith("fx_") for p in debug.iterdir())


def test_corrupted_cache_entry_is_reported_once_and_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    _result(_job(cache))
    for so in (cache / "kernels").glob("*.so"):
        so.write_bytes(so.read_bytes()[: 100])  # truncated
    res, err = _result(_job(cache))
    assert res["kernel_cache_corrupt"] >= 1 and res["kernels_built"] >= 1
    assert err.count("corrupted or truncated") == 1
    again, _ = _result(_job(cache))
    assert again["kernels_built"] == 0 and again["kernel_cache_corrupt"] == 0


def _read_only_job(cache, mount, scratch):
    """cache_job.py with `mount` made a read-only file system (a bind mount in a mount namespace
    of its own: unshare -m as root, a user namespace otherwise)."""
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    probe = subprocess.run([*unshare, "sh", "-c", f"mount --bind '{mount}' '{mount}'"], capture_output=True, text=True)
    if probe.returncode:
        pytest.skip(f"cannot make a read-only mount here (needs mount namespaces): {probe.stderr.strip()}")
    env = {**os.environ, "TORCH_NEURONX_CACHE_DIR": str(cache), "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "0",
           "TMPDIR": str(scratch)}
    script = (f"mount --bind '{mount}' '{mount}' && mount -o remount,bind,ro '{mount}' && "
              f"touch '{mount}/probe' 2>/dev/null && exit 99; exec '{sys.executable}' '{JOB}'")
    p = subprocess.Popen([*unshare, "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    res, err = _result(p)
    return res, err


def test_a_read_only_cache_serves_its_kernels_and_new_ones_build_for_the_process(tmp_path):
    cache, scratch = tmp_path / "cache", tmp_path / "scratch"
    scratch.mkdir()
    _result(_job(cache))  # warm
    warm, err = _read_only_job(cache, cache, scratch)
    assert warm["kernels_built"] == 0 and warm["kernel_cache_hits"] >= 1, warm  # read from the read-only cache
    assert err.count("cannot be written") == 1 and "Read-only file system" in err
    # A cache directory that does not exist under a read-only parent: everything compiles, in
    # a scratch directory of the process that is gone after it exits.
    parent = tmp_path / "ro"
    parent.mkdir()
    cold, err = _read_only_job(parent / "cache", parent, scratch)
    assert cold["kernels_built"] >= 1 and cold["compiles"] >= 1, cold
    assert err.count("cannot be written") == 1
    assert not list(scratch.iterdir()), list(scratch.iterdir())
    assert not (parent / "cache").exists()


def test_a_prologue_value_the_epilogue_reads_is_computed_again_in_the_row_group():
    # Found by the compile fuzzer (tests/reliability/fuzz_compile.py, seed 2 graph 7): x.abs() + 1
    # does not depend on the softmax, so it went to the row kernel's first phase only, and the
    # phase after the softmax read a value it never had (IndexError: map::at at compile time).
    def fn(x, b):
        y = torch.softmax(x - b, -1)
        return torch.sigmoid(y / (x.abs() + 1))

    for shape in ((1, 16), (8, 33)):
        x, b = torch.randn(*shape), torch.randn(shape[-1])
        got = torch.compile(fn, backend="neuron")(x.to("neuron"), b.to("neuron"))
        torch.testing.assert_close(got.cpu(), fn(x, b), rtol=1e-5, atol=1e-6)
    assert compile_metrics()["fused_row_groups"] >= 1


def test_cache_files_are_user_only(tmp_path):
    cache = tmp_path / "cache"
    _result(_job(cache))
    for d in (cache, cache / "kernels", cache / "graphs"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    libs, sums = list((cache / "kernels").glob("*.so")), list((cache / "kernels").glob("*.sum"))
    assert libs and len(libs) == len(sums)
    assert {stat.S_IMODE(p.stat().st_mode) for p in libs} == {0o700}
    assert {stat.S_IMODE(p.stat().st_mode) for p in sums} == {0o600}


def _refused(cache, why):
    p = _job(cache)
    _, err = p.communicate(timeout=300)
    assert p.returncode != 0
    assert "is not private" in err and why in err and "TORCH_NEURONX_CACHE_DIR" in err, err[-3000:]
    assert not (cache / "kernels").exists()  # nothing written, nothing loaded


def test_cache_directory_others_can_write_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o777)
    _refused(cache, "can be written by other users (mode 0777)")
    # Under a directory others can change (not sticky): they could swap the cache for their own.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    _refused(shared / "cache", "can be changed by other users")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory owned by another user needs root")
def test_cache_directory_of_another_user_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, 65534, 65534)
    _refused(cache, "belongs to another user (uid 65534)")


def test_cache_entry_others_can_write_is_rebuilt_not_loaded(tmp_path):
    cache = tmp_path / "cache"
    _result(_job(cache))
    libs = list((cache / "kernels").glob("*.so"))
    for so in libs:
        so.chmod(0o666)  # anyone could have replaced it
    res, err = _result(_job(cache))
    assert res["kernels_built"] >= len(libs) and err.count("is not private") == 1
    assert {stat.S_IMODE(p.stat().st_mode) for p in libs} == {0o700}
    again, _ = _result(_job(cache))
    assert again["kernels_built"] == 0


def test_two_processes_compiling_the_same_graph_both_succeed(tmp_path):
    cache = tmp_path / "cache"
    procs = [_job(cache) for _ in range(2)]
    results = [_result(p)[0] for p in procs]
    assert all(r["compiles"] >= 1 for r in results)
    assert not list((cache / "kernels").glob(".tmp-*"))  # no temporary files left behind


def test_integer_histc_inside_an_executable_counts_as_eager_does():
    # Hugging Face's MoE routing: histc of expert ids (integers) on an accelerator.
    def route(ids):
        return torch.histc(ids, bins=4, min=0, max=3).cumsum(0)

    ids = torch.tensor([3, 0, 1, 1, 3, 3], dtype=torch.int32, device="neuron")
    torch.testing.assert_close(torch.compile(route, backend="neuron")(ids), route(ids))


def test_conformance_tool_compile_sweep(tmp_path):
    # The OpInfo-driven compile sweep (python -m torch_neuronx.conformance --compile), a few ops here;
    # the full run's totals are in docs/compile.md.
    r = subprocess.run([sys.executable, "-m", "torch_neuronx.conformance", "--compile", "--ops",
                        "add,mul,sin,mm,softmax,nn.functional.layer_norm,cat,where", "--dtypes", "float32",
                        "--max-samples", "2", "--jobs", "1", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "results.json").read_text())["results"]
    assert len(res) >= 14 and all(x["cat"] == "compile" for x in res)
    assert all(x["outcome"] == "pass" for x in res), [x for x in res if x["outcome"] != "pass"]


@pytest.mark.runs_eagerly
def test_sweeps_count_a_graph_run_eagerly_as_its_own_outcome():
    # The compile sweeps' checks (op sweep, Hugging Face sweep) wrap each case: right values from
    # a graph the compiler refused are the outcome "eager", not a pass.
    from torch_neuronx.conformance.op_checks import Outcome, counting_eager_graphs
    from torch_neuronx.conformance.report import markdown

    def refused():  # the exporter does not take torch.cond's subgraphs: the graph runs eagerly
        f = torch.compile(lambda x: torch.cond(x.sum() > 0, lambda y: y.sin(), lambda y: y.cos(), (x,)) * 2,
                          backend="neuron")
        return f(torch.ones(3, device="neuron")), None

    def lowered():
        return torch.compile(lambda x: x.sin() + 1, backend="neuron")(torch.ones(3, device="neuron")), None

    assert counting_eager_graphs(lowered)()[0].shape == (3,)
    with pytest.raises(Outcome) as e:
        counting_eager_graphs(refused)()
    assert e.value.outcome == "eager" and "ran eagerly" in e.value.detail
    recs = [{"kind": "op", "name": "sin", "dtype": "float32", "cat": "compile", "outcome": o, "id": f"sin|{i}",
             "detail": d} for i, (o, d) in enumerate([("pass", None), ("eager", e.value.detail)])]
    md = markdown(recs, {"torch": "x", "date": "d", "seconds": 1, "jobs": 1, "crashes": 0})
    assert "| compile | 1 | 1 | 0 | 0 | 0 | 50.00% |" in md, md


def test_effectful_checks_compile_in_graph_order_and_raise_linalg_errors():
    # linalg ops check their results through an effect token (with_effects(token,
    # _linalg_check_errors, info)): the check is a node of the executable, kept by dead-code
    # elimination though it returns nothing, and its error is torch.linalg.LinAlgError.
    f = torch.compile(lambda a, b: (torch.linalg.inv(a), torch.linalg.solve(a, b)), backend="neuron")
    a = torch.randn(64, 64) + 8 * torch.eye(64)
    b = torch.randn(64, 3)
    inv, sol = f(a.to("neuron"), b.to("neuron"))
    torch.testing.assert_close(inv.cpu(), torch.linalg.inv(a), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(sol.cpu(), torch.linalg.solve(a, b), rtol=1e-4, atol=1e-5)
    m = compile_metrics()
    assert m["eager_graphs"] == 0 and m["library_calls"]["aten::_linalg_check_errors"] >= 1, m
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        f(torch.zeros(64, 64, device="neuron"), b.to("neuron"))
        torch.neuron.synchronize()
    torch.testing.assert_close(f(a.to("neuron"), b.to("neuron"))[0].cpu(), inv.cpu())  # usable afterwards


RANDOM_PROGRAMS = {
    "dropout": lambda x: F.dropout(x, 0.5, training=True),
    "rand_like": lambda x: torch.rand_like(x) + x,
    "randn": lambda x: torch.randn(x.shape, device=x.device) * x,
    "randint": lambda x: torch.randint(0, 100, x.shape, device=x.device) + x,
    "randperm": lambda x: torch.randperm(x.numel(), device=x.device).float() + x,
    "bernoulli": lambda x: torch.bernoulli(x * 0.5),
}


@pytest.mark.parametrize("name", RANDOM_PROGRAMS)
def test_compiled_random_ops_draw_at_launch_from_the_neuron_generator(name):
    """A launch takes the neuron generator's state when the host queues it, as eager ops do:
    a manual_seed after it (the queue still busy) does not reach it, and the draws are eager's."""
    fn = RANDOM_PROGRAMS[name]
    f = torch.compile(fn, backend="neuron")
    x = torch.ones(4096, device="neuron")
    m = torch.randn(1024, 1024, device="neuron")
    torch.manual_seed(7)  # CPU's generator differs from neuron's below: drawing from it shows
    torch.neuron.manual_seed(3)
    expected = fn(x)
    busy = m
    for _ in range(6):
        busy = busy @ m  # the launches below wait behind these
    torch.neuron.manual_seed(3)
    a = f(x)
    torch.neuron.manual_seed(3)
    b = f(x)
    assert torch.equal(a, expected) and torch.equal(b, expected)


def test_random_ops_compile_and_draw_from_the_neuron_generator():
    f = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="neuron")
    x = torch.ones(4096, device="neuron")
    torch.manual_seed(3)
    a = f(x)
    torch.manual_seed(3)
    b = f(x)
    c = f(x)
    assert torch.equal(a, b) and not torch.equal(b, c)  # seeded by torch.manual_seed, advancing
    kept = (a != 0).float().mean().item()
    assert 0.45 < kept < 0.55 and set(a.unique().tolist()) == {0.0, 2.0}
    # The harness's RNG freezing (get/set_rng_state under no_dispatch) runs eagerly inside compiled code.
    with torch.random.fork_rng(device_type="neuron"):
        torch.testing.assert_close(torch.compile(lambda t: t.sin() + torch.neuron.get_rng_state().numel(),
                                                 backend="neuron")(x).cpu(), x.cpu().sin() + 16)
