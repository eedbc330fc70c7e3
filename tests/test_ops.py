"""ATen ops on neuron compared with the same ops on CPU."""
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_neuronx

DEV = torch.device("neuron")


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def rand(*shape, dtype=torch.float32, seed=0, low=None, high=None):
    g = gen(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        if low is not None:
            t = torch.rand(shape, generator=g, dtype=torch.float64) * (high - low) + low
        return t.to(dtype)
    if low is None:
        low, high = (0, 40) if dtype == torch.uint8 else (-20, 20)
    return torch.randint(low, high, shape, generator=g, dtype=dtype)


def to_dev(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(DEV).requires_grad_(obj.requires_grad)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_dev(o) for o in obj)
    if isinstance(obj, dict):
        return {k: to_dev(v) for k, v in obj.items()}
    return obj


def compare(actual, expected, exact=False, atol=None, rtol=None):
    """actual comes from neuron (its tensors must live on neuron), expected from CPU."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), type(actual)
        assert actual.device.type == "neuron", actual.device
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        assert actual.shape == expected.shape, (actual.shape, expected.shape)
        a = actual.cpu()
        if exact:
            assert torch.equal(a.resolve_conj(), expected.resolve_conj()) or (
                a.is_floating_point() and torch.equal(a.isnan(), expected.isnan())
                and torch.equal(a.nan_to_num(), expected.nan_to_num())), (a, expected)
        else:
            torch.testing.assert_close(a, expected, atol=atol, rtol=rtol, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            compare(a, e, exact, atol, rtol)
    else:
        assert actual == expected, (actual, expected)


def check(fn, *args, exact=False, atol=None, rtol=None, **kwargs):
    """Runs fn on CPU arguments and on neuron copies of them and compares the results."""
    expected = fn(*args, **kwargs)
    actual = fn(*to_dev(args), **to_dev(kwargs))
    compare(actual, expected, exact, atol, rtol)
    return actual, expected


# ----------------------------------------------------------------------------- pointwise

UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "expm1": torch.expm1, "log1p_abs": lambda x: torch.log1p(x.abs()),
    "log_abs": lambda x: torch.log(x.abs() + 0.1), "sqrt_abs": lambda x: torch.sqrt(x.abs()), "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1),
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
    "atan": torch.atan, "asin": lambda x: torch.asin(x.clamp(-1, 1)), "erf": torch.erf, "erfinv": lambda x: torch.erfinv(x.clamp(-0.99, 0.99)),
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "frac": torch.frac,
    "sign": torch.sign, "reciprocal": lambda x: torch.reciprocal(x + 10), "square": torch.square,
    "relu": torch.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "softplus": F.softplus, "elu": F.elu, "leaky_relu": F.leaky_relu, "hardswish": F.hardswish, "mish": F.mish,
    "logit": lambda x: torch.logit(torch.sigmoid(x)), "lgamma": lambda x: torch.lgamma(x.abs() + 0.5),
    "digamma": lambda x: torch.digamma(x.abs() + 0.5), "isnan": torch.isnan, "isfinite": torch.isfinite,
    "nan_to_num": lambda x: torch.nan_to_num(x / 0), "clamp": lambda x: torch.clamp(x, -0.5, 0.7),
    "clamp_min": lambda x: x.clamp(min=0.1), "bitwise_not_bool": lambda x: torch.bitwise_not(x > 0),
    "logical_not": lambda x: torch.logical_not(x > 0), "pow_scalar": lambda x: torch.pow(x, 3), "pow_half": lambda x: x.abs() ** 0.5,
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float32(name):
    x = rand(7, 9, seed=1) * 2
    check(UNARY[name], x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_unary_other_float_dtypes(dtype):
    x = rand(5, 6, seed=2, dtype=dtype)
    for name in ("neg", "abs", "exp", "sin", "tanh", "sigmoid", "sqrt_abs", "gelu", "silu", "floor", "relu"):
        check(UNARY[name], x)


def test_unary_integer():
    x = rand(4, 5, dtype=torch.int64, seed=3)
    check(torch.neg, x, exact=True)
    check(torch.abs, x, exact=True)
    check(torch.sign, x, exact=True)
    check(torch.bitwise_not, x, exact=True)
    check(torch.square, x, exact=True)
    check(lambda t: t.sqrt(), x.abs())  # promotes to float
    check(lambda t: -t, x.int(), exact=True)


def test_unary_complex():
    z = rand(4, 3, dtype=torch.complex64, seed=4)
    for f in (torch.abs, torch.angle, torch.exp, torch.sqrt, torch.sin, torch.conj_physical, torch.neg,
              lambda t: t * (2 - 1j), lambda t: t.real + t.imag, torch.reciprocal):
        check(f, z)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "add_alpha": lambda a, b: torch.add(a, b, alpha=2.5), "sub_alpha": lambda a, b: torch.sub(a, b, alpha=0.5),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"), "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "pow": lambda a, b: torch.pow(a.abs() + 0.1, b), "atan2": torch.atan2, "maximum": torch.maximum, "minimum": torch.minimum,
    "fmod": torch.fmod, "remainder": torch.remainder, "hypot": torch.hypot, "copysign": torch.copysign,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": lambda a, b: torch.logical_and(a > 0, b > 0), "logical_xor": lambda a, b: torch.logical_xor(a > 0, b > 0),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "xlogy": lambda a, b: torch.xlogy(a, b.abs()),
    "floor_divide": torch.floor_divide, "fmax": torch.fmax, "logaddexp": torch.logaddexp,
}

BROADCAST_SHAPES = [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (4, 1)), ((2, 3, 4), ()), ((), (6,))]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasting(name, shapes):
    a = rand(*shapes[0], seed=5)
    b = rand(*shapes[1], seed=6) + 0.05
    check(BINARY[name], a, b)


LOSSES = {
    "binary_cross_entropy_with_logits": lambda a, b: F.binary_cross_entropy_with_logits(a, torch.sigmoid(b)),
    "mse_loss": F.mse_loss, "mse_loss_sum": lambda a, b: F.mse_loss(a, b, reduction="sum"),
    "mse_loss_none": lambda a, b: F.mse_loss(a, b, reduction="none"), "smooth_l1": F.smooth_l1_loss,
    "huber": F.huber_loss, "l1_loss": F.l1_loss, "soft_margin": F.soft_margin_loss,
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_pointwise_losses(name):
    check(LOSSES[name], rand(4, 5, seed=5), rand(4, 5, seed=6))


PROMOTION_CASES = [
    (torch.int64, torch.float32), (torch.int32, torch.int64), (torch.float16, torch.float32),
    (torch.bfloat16, torch.float16), (torch.bool, torch.int8), (torch.uint8, torch.int8), (torch.float32, torch.float64),
    (torch.int64, torch.complex64), (torch.float64, torch.complex64), (torch.bool, torch.float16),
]


@pytest.mark.parametrize("da,db", PROMOTION_CASES, ids=lambda d: str(d).replace("torch.", ""))
def test_type_promotion(da, db):
    a = rand(3, 4, dtype=da, seed=7)
    b = rand(4, dtype=db, seed=8)
    for f in (torch.add, torch.mul, torch.sub if torch.bool not in (da, db) else torch.add, torch.eq):
        check(f, a, b, exact=not (a.is_floating_point() or b.is_floating_point() or a.is_complex() or b.is_complex()))
    check(torch.true_divide, a, b.abs() + 1)


def test_type_promotion_with_python_scalars_and_cpu_scalar_tensors():
    a = rand(3, 4, dtype=torch.int32, seed=9)
    check(lambda t: t + 2.5, a)          # int tensor + float scalar -> float32
    check(lambda t: t * 3, a, exact=True)
    check(lambda t: t / 2, a)            # true division -> float
    check(lambda t: t // 3, a, exact=True)
    h = rand(3, 4, dtype=torch.float16, seed=10)
    check(lambda t: t + 1e-3, h)         # stays half
    check(lambda t: t * torch.tensor(2.0, dtype=torch.float64), h)  # 0-dim CPU operand: dim wins, stays half
    f = rand(3, 4, seed=11)
    check(lambda t: t + torch.tensor(3), f)  # CPU 0-dim int tensor mixed with neuron float
    check(lambda t: t > 0.2, f, exact=True)
    check(lambda t: 1 - t, f)
    check(lambda t: 2 ** t, f)
    check(lambda t: t + (1 + 2j), f)


def test_cpu_non_scalar_operand_rejected():
    d = torch.ones(3, device=DEV)
    with pytest.raises(RuntimeError, match="same device|neuron"):
        d + torch.ones(3)


INPLACE = {
    "add_": lambda x, y: x.add_(y), "mul_": lambda x, y: x.mul_(y), "sub_alpha": lambda x, y: x.sub_(y, alpha=3),
    "div_": lambda x, y: x.div_(y + 5), "clamp_": lambda x, y: x.clamp_(-0.3, 0.3), "relu_": lambda x, y: x.relu_(),
    "addcmul_": lambda x, y: x.addcmul_(y, y, value=0.5), "addcdiv_": lambda x, y: x.addcdiv_(y, y.abs() + 1, value=-2),
    "lerp_": lambda x, y: x.lerp_(y, 0.25), "fill_": lambda x, y: x.fill_(1.5), "zero_": lambda x, y: x.zero_(),
    "pow_": lambda x, y: x.abs_().pow_(2), "exp_": lambda x, y: x.exp_(), "sigmoid_": lambda x, y: x.sigmoid_(),
    "masked_fill_": lambda x, y: x.masked_fill_(y > 0, -7.0), "copy_": lambda x, y: x.copy_(y),
    "add_broadcast": lambda x, y: x.add_(y[0]), "mul_scalar": lambda x, y: x.mul_(2), "neg_": lambda x, y: x.neg_(),
    "iadd_op": lambda x, y: x.__iadd__(y), "imul_op": lambda x, y: x.__imul__(y),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace(name):
    x = rand(4, 6, seed=12)
    y = rand(4, 6, seed=13)
    xd, yd = x.to(DEV), y.to(DEV)
    ptr = xd.data_ptr()
    r = INPLACE[name](xd, yd)
    e = INPLACE[name](x, y)
    assert r is xd
    assert xd.data_ptr() == ptr
    compare(xd, x)
    compare(r, e)


def test_inplace_on_noncontiguous_view():
    x = rand(6, 8, seed=14)
    xd = x.to(DEV)
    xd.t()[::2].mul_(3).add_(1)
    x.t()[::2].mul_(3).add_(1)
    compare(xd, x, exact=True)


def test_inplace_type_promotion_error_matches_cpu():
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int64, device=DEV).add_(torch.ones(3, device=DEV) * 0.5)


# ----------------------------------------------------------------------------- out= variants

def test_out_same_shape():
    a, b = rand(3, 4, seed=15), rand(3, 4, seed=16)
    out = torch.empty(3, 4, device=DEV)
    r = torch.add(a.to(DEV), b.to(DEV), out=out)
    assert r is out
    compare(out, a + b)


@pytest.mark.parametrize("initial", [(0,), (2,), (100, 7), (3, 4, 5)], ids=str)
def test_out_resized(initial):
    a, b = rand(3, 4, seed=17), rand(3, 4, seed=18)
    out = torch.empty(initial, device=DEV)
    r = torch.mul(a.to(DEV), b.to(DEV), out=out)
    assert r is out
    assert out.shape == (3, 4)
    compare(out, a * b)


def test_out_resized_matmul_and_reduction():
    a, b = rand(5, 6, seed=19), rand(6, 3, seed=20)
    out = torch.empty(0, device=DEV)
    torch.mm(a.to(DEV), b.to(DEV), out=out)
    compare(out, a @ b)
    s = torch.empty(0, device=DEV)
    torch.sum(a.to(DEV), dim=1, out=s)
    compare(s, a.sum(1))
    v, i = torch.empty(0, device=DEV), torch.empty(0, dtype=torch.int64, device=DEV)
    torch.max(a.to(DEV), dim=0, out=(v, i))
    ev, ei = a.max(0)
    compare(v, ev)
    compare(i, ei, exact=True)
    c = torch.empty(1, device=DEV)
    torch.cat([a.to(DEV), a.to(DEV)], out=c)
    compare(c, torch.cat([a, a]))


def test_out_dtype_cast_and_noncontiguous_out():
    a = rand(4, 4, seed=21)
    out = torch.empty(4, 4, dtype=torch.float64, device=DEV)
    torch.exp(a.to(DEV), out=out)  # float32 computation written into a float64 out
    compare(out, torch.exp(a, out=torch.empty(4, 4, dtype=torch.float64)))
    base = torch.zeros(4, 8, device=DEV)
    torch.neg(a.to(DEV), out=base[:, ::2])
    eb = torch.zeros(4, 8)
    torch.neg(a, out=eb[:, ::2])
    compare(base, eb, exact=True)


def test_out_data_dependent_resize():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0, 3.0])
    out = torch.empty(0, dtype=torch.int64, device=DEV)
    torch.nonzero(x.to(DEV), out=out)
    compare(out, torch.nonzero(x), exact=True)
    ms = torch.empty(0, device=DEV)
    torch.masked_select(x.to(DEV), x.to(DEV) > 0.5, out=ms)
    compare(ms, x[x > 0.5], exact=True)


# ----------------------------------------------------------------------------- reductions

REDUCTIONS = {
    "sum": lambda x: x.sum(), "sum_dim": lambda x: x.sum(1), "sum_dims_keep": lambda x: x.sum((0, 2), keepdim=True),
    "mean": lambda x: x.mean(), "mean_dim": lambda x: x.mean(-1), "prod": lambda x: x.prod(1),
    "max": lambda x: x.max(), "min": lambda x: x.min(), "max_dim": lambda x: tuple(x.max(dim=1)),
    "min_dim_keep": lambda x: tuple(x.min(dim=2, keepdim=True)), "argmax": lambda x: x.argmax(), "argmax_dim": lambda x: x.argmax(1),
    "argmin_dim": lambda x: x.argmin(-1), "amax": lambda x: x.amax((1, 2)), "var": lambda x: x.var(), "var_dim": lambda x: x.var(1),
    "var_unbiased0": lambda x: x.var(0, correction=0), "std": lambda x: x.std(2), "std_mean": lambda x: torch.std_mean(x, 1),
    "var_mean": lambda x: torch.var_mean(x, (0, 1)), "cumsum": lambda x: x.cumsum(1), "cumprod": lambda x: (x / 2).cumprod(2),
    "cummax": lambda x: tuple(x.cummax(0)), "logsumexp": lambda x: x.logsumexp(1), "norm": lambda x: x.norm(),
    "norm_dim": lambda x: torch.linalg.vector_norm(x, 3, dim=1), "sort": lambda x: tuple(x.sort(1)),
    "sort_desc": lambda x: tuple(x.sort(-1, descending=True)), "argsort": lambda x: x.argsort(0),
    "topk": lambda x: tuple(x.topk(3, dim=2)), "topk_smallest": lambda x: tuple(x.topk(2, dim=1, largest=False)),
    "kthvalue": lambda x: tuple(x.kthvalue(2, 1)), "median_dim": lambda x: tuple(x.median(1)), "all": lambda x: (x > -3).all(),
    "any_dim": lambda x: (x > 1).any(1), "count_nonzero": lambda x: torch.count_nonzero(x > 0, 1), "aminmax": lambda x: tuple(torch.aminmax(x, dim=0)),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reductions(name):
    x = rand(4, 5, 6, seed=22)
    check(REDUCTIONS[name], x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bfloat16, torch.float16], ids=str)
def test_reductions_dtypes(dtype):
    x = rand(6, 7, seed=23, dtype=dtype)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype in (torch.bfloat16, torch.float16) else {}
    check(lambda t: t.sum(1), x, **tol)
    check(lambda t: t.sum(), x, **tol)
    check(lambda t: tuple(t.max(0)), x, **tol)
    check(lambda t: t.argmin(1), x)
    check(lambda t: t.cumsum(0), x, **tol)
    check(lambda t: tuple(t.sort(dim=1, stable=True)), x)
    if dtype.is_floating_point:
        check(lambda t: t.mean(0), x, **tol)
        check(lambda t: t.std(1), x, **tol)


def test_sum_dtype_arg_and_int_sum_promotes():
    x = rand(5, 5, dtype=torch.int32, seed=24)
    check(lambda t: t.sum(), x, exact=True)  # int32 sums to int64
    check(lambda t: t.sum(dtype=torch.float64), x)
    b = rand(5, 5, dtype=torch.bool, seed=25)
    check(lambda t: t.sum(0), b, exact=True)


# ----------------------------------------------------------------------------- linear algebra and nn

def test_matmul_family():
    a, b = rand(5, 7, seed=26), rand(7, 3, seed=27)
    check(torch.matmul, a, b)
    check(torch.mm, a, b)
    check(lambda x, y: x @ y, a, b)
    check(torch.matmul, rand(2, 3, 5, 7, seed=28), rand(7, 4, seed=29))  # batched broadcast
    check(torch.matmul, rand(7, seed=30), rand(3, 7, 2, seed=31))
    check(torch.matmul, rand(7, seed=32), rand(7, seed=33))  # dot
    check(torch.mv, a, rand(7, seed=34))
    check(torch.bmm, rand(4, 3, 5, seed=35), rand(4, 5, 6, seed=36))
    check(torch.baddbmm, rand(4, 3, 6, seed=37), rand(4, 3, 5, seed=35), rand(4, 5, 6, seed=36), beta=0.5, alpha=2)
    check(torch.addmm, rand(3, seed=38), a, b)
    check(lambda c, x, y: torch.addmm(c, x, y, beta=0.3, alpha=-1.5), rand(5, 3, seed=39), a, b)
    check(torch.outer, rand(4, seed=40), rand(3, seed=41))
    check(lambda x, y: x.t() @ y.t(), b, a)  # transposed operands
    check(torch.matmul, rand(5, 7, dtype=torch.float64, seed=42), rand(7, 3, dtype=torch.float64, seed=43))
    check(torch.matmul, rand(4, 4, dtype=torch.bfloat16, seed=44), rand(4, 4, dtype=torch.bfloat16, seed=45), atol=1e-2, rtol=1e-2)
    check(torch.matmul, rand(4, 4, dtype=torch.int64, seed=46), rand(4, 4, dtype=torch.int64, seed=47), exact=True)
    check(torch.matmul, rand(3, 3, dtype=torch.complex64, seed=48), rand(3, 2, dtype=torch.complex64, seed=49))


def test_einsum():
    check(lambda a, b: torch.einsum("bij,bjk->bik", a, b), rand(2, 3, 4, seed=50), rand(2, 4, 5, seed=51))
    check(lambda a: torch.einsum("ii->i", a), rand(4, 4, seed=52))
    check(lambda a, b: torch.einsum("i,j->ij", a, b), rand(3, seed=53), rand(5, seed=54))
    check(lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), rand(2, 2, 3, 4, seed=55), rand(2, 2, 5, 4, seed=56))
    check(lambda a: torch.einsum("ijk->", a), rand(2, 3, 4, seed=57))


def test_linear():
    check(F.linear, rand(5, 8, seed=61), rand(6, 8, seed=62), rand(6, seed=63))
    check(F.linear, rand(2, 5, 8, seed=61), rand(6, 8, seed=62))
    lin = torch.nn.Linear(8, 3)
    lin_d = torch.nn.Linear(8, 3).to(DEV)
    lin_d.load_state_dict(lin.state_dict())
    compare(lin_d(rand(4, 8, seed=64).to(DEV)), lin(rand(4, 8, seed=64)))


CONVS = {
    "conv2d_bias": lambda i, k: F.conv2d(i, k, torch.ones(4, device=i.device)),
    "conv2d_stride_pad": lambda i, k: F.conv2d(i, k, stride=2, padding=1),
    "conv2d_dilation": lambda i, k: F.conv2d(i, k, dilation=2),
    "conv2d_groups_same": lambda i, k: F.conv2d(i, k.reshape(12, 1, 3, 3)[:6], padding="same", groups=3),
    "conv1d": lambda i, k: F.conv1d(i.flatten(2), k[:, :, 0], padding=2),
    "conv_transpose2d": lambda i, k: F.conv_transpose2d(i, k.transpose(0, 1), stride=2),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv(name):
    check(CONVS[name], rand(2, 3, 10, 9, seed=58), rand(4, 3, 3, 3, seed=59), atol=1e-4, rtol=1e-4)


def test_pool_and_resample():
    x = rand(2, 3, 10, 9, seed=58)
    check(lambda i: F.max_pool2d(i, 2), x)
    check(lambda i: F.max_pool2d(i, 3, stride=2, padding=1, return_indices=True), x)
    check(lambda i: F.avg_pool2d(i, 2, ceil_mode=True), x)
    check(lambda i: F.adaptive_avg_pool2d(i, (3, 2)), x)
    check(lambda i: F.interpolate(i, scale_factor=2, mode="nearest"), x)
    check(lambda i: F.interpolate(i, size=(7, 5), mode="bilinear", align_corners=False), x, atol=1e-5, rtol=1e-5)
    check(lambda i: F.pad(i, (1, 2, 0, 1), value=3.0), x)
    check(lambda i: F.pad(i, (2, 2, 1, 1), mode="reflect"), x)


def test_normalization():
    x = rand(4, 6, 5, seed=69)
    w, b = rand(5, seed=70), rand(5, seed=71)
    check(lambda i, ww, bb: F.layer_norm(i, (5,), ww, bb), x, w, b, atol=1e-5, rtol=1e-5)
    check(lambda i: F.layer_norm(i, (6, 5)), x, atol=1e-5, rtol=1e-5)
    check(lambda i, ww: F.rms_norm(i, (5,), ww), x, w, atol=1e-5, rtol=1e-5)
    check(lambda i: F.group_norm(i, 2), rand(3, 6, 4, 4, seed=72), atol=1e-5, rtol=1e-5)
    check(lambda i: F.normalize(i, dim=-1), x)
    # batch norm in eval mode with given running stats
    xb = rand(8, 3, 4, 4, seed=73)
    rm, rv = rand(3, seed=74), rand(3, seed=75).abs() + 0.5
    check(lambda i, m, v, ww, bb: F.batch_norm(i, m, v, ww, bb, training=False), xb, rm, rv, rand(3, seed=76), rand(3, seed=77),
          atol=1e-5, rtol=1e-5)


def test_batch_norm_train_updates_running_stats():
    xb = rand(8, 3, 4, 4, seed=78) * 3 + 1
    m_cpu = torch.nn.BatchNorm2d(3, momentum=0.2)
    m_dev = torch.nn.BatchNorm2d(3, momentum=0.2).to(DEV)
    m_dev.load_state_dict(m_cpu.state_dict())
    for step in range(3):
        inp = xb + step
        y_cpu = m_cpu(inp)
        y_dev = m_dev(inp.to(DEV))
        compare(y_dev, y_cpu, atol=1e-5, rtol=1e-5)
    compare(m_dev.running_mean, m_cpu.running_mean, atol=1e-6, rtol=1e-5)
    compare(m_dev.running_var, m_cpu.running_var, atol=1e-5, rtol=1e-5)
    compare(m_dev.num_batches_tracked, m_cpu.num_batches_tracked, exact=True)
    assert int(m_dev.num_batches_tracked) == 3
    # running stats actually moved away from their initial values
    assert not torch.allclose(m_dev.running_mean.cpu(), torch.zeros(3))
    m_cpu.eval()
    m_dev.eval()
    compare(m_dev(xb.to(DEV)), m_cpu(xb), atol=1e-5, rtol=1e-5)


def test_softmax_and_losses():
    x = rand(4, 10, seed=79) * 3
    t = torch.tensor([1, 0, 9, 3])
    check(lambda i: F.softmax(i, dim=-1), x)
    check(lambda i: F.softmax(i, dim=0), x)
    check(lambda i: F.log_softmax(i, dim=1), x)
    check(lambda i: F.softmax(i.half(), dim=1), x, atol=1e-3, rtol=1e-3)
    check(lambda i: F.softmax(i, dim=1, dtype=torch.float64), x)
    check(F.cross_entropy, x, t)
    check(lambda i, tt: F.cross_entropy(i, tt, reduction="none", label_smoothing=0.1), x, t)
    check(lambda i, tt: F.cross_entropy(i, tt, ignore_index=0), x, t)
    check(lambda i, tt: F.cross_entropy(i, tt, weight=torch.linspace(0.5, 2, 10, device=i.device)), x, t)
    check(lambda i, p: F.cross_entropy(i, p.softmax(-1)), x, rand(4, 10, seed=80))  # probabilities target
    check(lambda i, tt: F.cross_entropy(i, tt), rand(2, 5, 3, 3, seed=81), torch.randint(0, 5, (2, 3, 3), generator=gen(82)))
    check(F.nll_loss, F.log_softmax(x, 1), t)
    check(lambda i, tt: F.kl_div(i, tt, reduction="batchmean"), F.log_softmax(x, 1), F.softmax(x * 0.5, 1))
    check(F.binary_cross_entropy, torch.sigmoid(x), torch.rand(4, 10, generator=gen(83)))


def test_embedding():
    w = rand(10, 4, seed=84)
    idx = torch.tensor([[1, 2, 4], [9, 0, 1]])
    check(F.embedding, idx, w, exact=True)
    check(lambda i, ww: F.embedding(i, ww, padding_idx=1), idx, w, exact=True)
    emb = torch.nn.Embedding(10, 4)
    emb_d = torch.nn.Embedding(10, 4).to(DEV)
    emb_d.load_state_dict(emb.state_dict())
    compare(emb_d(idx.to(DEV)), emb(idx), exact=True)


def test_embedding_bag():
    # in a child process: a crash here must fail this test only
    run_isolated("""
        import torch
        import torch.nn.functional as F
        w = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))
        idx, off = torch.tensor([1, 2, 4, 5, 4, 3]), torch.tensor([0, 2])
        for mode in ("mean", "sum", "max"):
            e = F.embedding_bag(idx, w, off, mode=mode)
            d = F.embedding_bag(idx.to("neuron"), w.to("neuron"), off.to("neuron"), mode=mode)
            assert d.device.type == "neuron"
            torch.testing.assert_close(d.cpu(), e, msg=lambda m: mode + ": " + m)
            bag = torch.nn.EmbeddingBag(10, 4, mode=mode)
            bag_d = torch.nn.EmbeddingBag(10, 4, mode=mode).to("neuron")
            bag_d.load_state_dict(bag.state_dict())
            torch.testing.assert_close(bag_d(idx.view(2, 3).to("neuron")).cpu(), bag(idx.view(2, 3)))
            ws = torch.tensor([0.5, 1.0, 2.0, 1.0, 0.1, 3.0])
            if mode == "sum":  # per_sample_weights
                torch.testing.assert_close(
                    F.embedding_bag(idx.to("neuron"), w.to("neuron"), off.to("neuron"), mode=mode,
                                    per_sample_weights=ws.to("neuron")).cpu(),
                    F.embedding_bag(idx, w, off, mode=mode, per_sample_weights=ws))
    """)


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(causal):
    q, k, v = rand(2, 3, 5, 8, seed=85), rand(2, 3, 7, 8, seed=86), rand(2, 3, 7, 8, seed=87)
    if causal:
        k, v = k[:, :, :5], v[:, :, :5]
    check(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v, atol=1e-5, rtol=1e-5)
    mask = torch.rand(5, k.shape[2], generator=gen(88)) > 0.3
    mask[:, 0] = True
    check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, k, v, mask, atol=1e-5, rtol=1e-5)
    check(lambda a, b, c, m: F.scaled_dot_product_attention(a, b, c, attn_mask=m, scale=0.3), q, k, v,
          rand(5, k.shape[2], seed=89), atol=1e-5, rtol=1e-5)
    # the module form
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    mha_d = torch.nn.MultiheadAttention(8, 2, batch_first=True).to(DEV)
    mha_d.load_state_dict(mha.state_dict())
    x = rand(2, 5, 8, seed=90)
    out_d, w_d = mha_d(x.to(DEV), x.to(DEV), x.to(DEV))
    out, w = mha(x, x, x)
    compare(out_d, out, atol=1e-5, rtol=1e-5)
    compare(w_d, w, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- views

VIEWS = {
    "view": lambda t: t.view(6, 10), "view_flat": lambda t: t.view(-1), "reshape": lambda t: t.reshape(5, 12),
    "transpose": lambda t: t.transpose(0, 2), "t_of_2d": lambda t: t[0].t(), "permute": lambda t: t.permute(1, 2, 0),
    "narrow": lambda t: t.narrow(2, 1, 3), "select": lambda t: t.select(1, 2), "index_slice": lambda t: t[1:, ::2, -2:],
    "expand": lambda t: t[:, :1].expand(3, 6, 5), "unsqueeze": lambda t: t.unsqueeze(1), "squeeze": lambda t: t[:, :1].squeeze(1),
    "unfold": lambda t: t.unfold(2, 2, 1), "as_strided": lambda t: t.as_strided((3, 3), (7, 2), 1),
    "diagonal": lambda t: t.diagonal(0, 1, 2), "diagonal_offset": lambda t: t.diagonal(1, 0, 2), "movedim": lambda t: t.movedim(0, -1),
    "flatten": lambda t: t.flatten(1), "unflatten": lambda t: t.unflatten(2, (5, 1)), "real_view": lambda t: t.view(torch.int32),
    "split": lambda t: t.split(2, dim=1), "split_sizes": lambda t: t.split([1, 3, 1], dim=2), "chunk": lambda t: t.chunk(3, 1),
    "unbind": lambda t: t.unbind(0), "tensor_split": lambda t: t.tensor_split(3, dim=2), "swapaxes": lambda t: t.swapaxes(1, 2),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_views_values_and_aliasing(name):
    x = rand(3, 4, 5, seed=91)
    xd = x.to(DEV)
    vd = VIEWS[name](xd)
    v = VIEWS[name](x)
    compare(vd, v, exact=True)
    outs = vd if isinstance(vd, (tuple, list)) else (vd,)
    for o in outs:
        assert o.untyped_storage().data_ptr() == xd.untyped_storage().data_ptr(), "view must alias its base"
    for o, oc in zip(outs, v if isinstance(v, (tuple, list)) else (v,)):
        assert o.stride() == oc.stride() and o.storage_offset() == oc.storage_offset()


@pytest.mark.parametrize("name", ["view", "transpose", "permute", "narrow", "select", "index_slice", "unfold", "as_strided",
                                  "diagonal", "split", "chunk", "unbind", "squeeze", "movedim", "real_view"])
def test_write_through_view_updates_base(name):
    x = rand(3, 4, 5, seed=92)
    xd = x.to(DEV)
    vd, v = VIEWS[name](xd), VIEWS[name](x)
    vd = vd[-1] if isinstance(vd, (tuple, list)) else vd
    v = v[-1] if isinstance(v, (tuple, list)) else v
    if name == "real_view":
        vd.bitwise_xor_(0x1234)
        v.bitwise_xor_(0x1234)
    else:
        vd.mul_(-2).add_(1)
        v.mul_(-2).add_(1)
    compare(xd, x, exact=True)


def test_view_as_real_and_complex():
    z = rand(3, 4, dtype=torch.complex64, seed=93)
    zd = z.to(DEV)
    r = torch.view_as_real(zd)
    compare(r, torch.view_as_real(z), exact=True)
    r[..., 1] = 0.0  # zero the imaginary parts through the view
    compare(zd, torch.complex(z.real, torch.zeros_like(z.real)), exact=True)
    p = rand(3, 4, 2, seed=94)
    compare(torch.view_as_complex(p.to(DEV)), torch.view_as_complex(p), exact=True)


def test_contiguous_of_views():
    x = rand(4, 5, 6, seed=95)
    for f in (lambda t: t.transpose(0, 2).contiguous(), lambda t: t[:, ::2].contiguous(), lambda t: t.expand(2, 4, 5, 6).reshape(8, 30)):
        check(f, x, exact=True)
        assert f(x.to(DEV)).is_contiguous()
    # reshape of a non-viewable layout copies, and does not alias
    xd = x.to(DEV)
    r = xd.transpose(0, 1).reshape(-1)
    r.fill_(0)
    compare(xd, x, exact=True)


# ----------------------------------------------------------------------------- data-dependent ops

def test_nonzero_unique_masked_select():
    x = rand(6, 7, dtype=torch.int64, seed=96, low=-3, high=4)
    check(torch.nonzero, x, exact=True)
    check(lambda t: torch.nonzero(t, as_tuple=True), x, exact=True)
    check(torch.argwhere, x, exact=True)
    check(torch.unique, x, exact=True)
    check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x, exact=True)
    check(lambda t: torch.unique(t, dim=0), x[:, :2] % 2, exact=True)
    check(lambda t: torch.unique_consecutive(t.flatten().sort()[0], return_counts=True), x, exact=True)
    check(lambda t: torch.masked_select(t, t > 0), x, exact=True)
    check(lambda t: torch.bincount(t.flatten() + 3), x, exact=True)
    f = rand(5, 6, seed=97)
    check(lambda t: t[t > 0], f, exact=True)
    check(lambda t: t[t[:, 0] > 0], f, exact=True)  # boolean row mask
    check(lambda t: t.repeat_interleave(torch.tensor([1, 0, 2, 1, 3], device=t.device), dim=0), f, exact=True)


def test_boolean_mask_assignment():
    x = rand(5, 6, seed=98)
    xd = x.to(DEV)
    xd[xd > 0] = 0
    x[x > 0] = 0
    compare(xd, x, exact=True)
    xd[xd < -1] = torch.tensor(7.0)
    x[x < -1] = torch.tensor(7.0)
    compare(xd, x, exact=True)
    m = torch.tensor([True, False, True, False, True])
    xd[m.to(DEV)] = torch.arange(6.0).to(DEV)
    x[m] = torch.arange(6.0)
    compare(xd, x, exact=True)
    # a CPU boolean mask for a neuron tensor (indexing accepts host indices as CUDA does)
    xd[m] = -1.0
    x[m] = -1.0
    compare(xd, x, exact=True)


def test_indexing_ops():
    x = rand(6, 5, seed=99)
    idx = torch.tensor([4, 0, 2, 2])
    check(lambda t, i: t[i], x, idx, exact=True)
    check(lambda t, i: t[:, i], x, idx, exact=True)
    check(lambda t, i: t[i, i], x, idx, exact=True)
    check(lambda t: t[[0, 5], 1:3], x, exact=True)
    check(lambda t, i: t[i[None], :2, None], x, idx, exact=True)
    check(lambda t, i: t.index_select(1, i), x, idx, exact=True)
    check(lambda t, i: torch.gather(t, 1, i), x, torch.randint(0, 5, (6, 3), generator=gen(100)), exact=True)
    check(lambda t, i: torch.take(t, i), x, torch.tensor([0, 29, 7]), exact=True)
    check(lambda t, i, s: t.scatter(0, i, s), x, torch.tensor([[1, 2, 3, 4, 5]]), rand(1, 5, seed=101), exact=True)
    check(lambda t, i, s: t.scatter_add(1, i, s), x, torch.randint(0, 5, (6, 4), generator=gen(102)), rand(6, 4, seed=103))
    check(lambda t, i, s: t.scatter_reduce(1, i, s, "amax", include_self=False), x,
          torch.randint(0, 5, (6, 4), generator=gen(104)), rand(6, 4, seed=105), exact=True)
    check(lambda t, i, s: t.index_add(0, i, s, alpha=2), x, idx, rand(4, 5, seed=106))
    check(lambda t, i: t.index_fill(1, i, -3.0), x, torch.tensor([1, 3]), exact=True)
    check(lambda t, i, s: t.index_copy(0, i, s), x, torch.tensor([5, 1]), rand(2, 5, seed=107), exact=True)
    check(lambda t, m: torch.where(m, t, -t), x, x > 0.3, exact=True)
    check(lambda t: torch.where(t > 0, t, 0.0), x, exact=True)
    check(lambda t, m: t.masked_fill(m, float("-inf")), x, x < 0, exact=True)
    check(lambda t, m, s: t.masked_scatter(m, s), x, x > 0, rand(30, seed=108), exact=True)
    check(lambda t: torch.index_put(t, (torch.tensor([0, 2], device=t.device),), torch.tensor(9.0, device=t.device)), x, exact=True)
    check(lambda t: torch.index_put(t, (torch.tensor([0, 0, 2], device=t.device), torch.tensor([1, 1, 3], device=t.device)),
                                    torch.tensor([1.0, 2.0, 3.0], device=t.device), accumulate=True), x)
    check(lambda t: torch.tril(t), x, exact=True)
    check(lambda t: torch.triu(t, 1), x, exact=True)
    check(lambda t: torch.flip(t, (0, 1)), x, exact=True)
    check(lambda t: torch.roll(t, 2, 1), x, exact=True)


def test_inplace_indexing_ops():
    x = rand(6, 5, seed=109)
    xd = x.to(DEV)
    i = torch.tensor([3, 1, 3])
    s = rand(3, 5, seed=110)
    xd.index_add_(0, i.to(DEV), s.to(DEV))
    x.index_add_(0, i, s)
    compare(xd, x)
    xd.scatter_(1, torch.tensor([[0], [4], [2], [0], [1], [3]]).to(DEV), 5.0)
    x.scatter_(1, torch.tensor([[0], [4], [2], [0], [1], [3]]), 5.0)
    compare(xd, x)
    xd[i.to(DEV)] = 0.5
    x[i] = 0.5
    compare(xd, x)
    xd[:, [0, 2]] += 1
    x[:, [0, 2]] += 1
    compare(xd, x)
    xd.index_put_((torch.tensor([0, 0]).to(DEV),), torch.ones(5, device=DEV), accumulate=True)
    x.index_put_((torch.tensor([0, 0]),), torch.ones(5), accumulate=True)
    compare(xd, x)
    xd.masked_fill_(xd > 1, 2.0)
    x.masked_fill_(x > 1, 2.0)
    compare(xd, x)


def test_item_and_tolist():
    x = rand(3, 4, seed=111)
    xd = x.to(DEV)
    assert xd[1, 2].item() == x[1, 2].item()
    assert xd.sum().item() == pytest.approx(x.sum().item(), rel=1e-6)
    assert xd.tolist() == x.tolist()
    assert (xd > 0).tolist() == (x > 0).tolist()
    i = torch.arange(5, device=DEV) * 3
    assert i.tolist() == [0, 3, 6, 9, 12]
    assert i[-1].item() == 12 and isinstance(i[-1].item(), int)
    assert torch.tensor(True, device=DEV).item() is True
    assert torch.tensor(2 + 3j, device=DEV).item() == 2 + 3j
    assert torch.tensor(1.5, dtype=torch.bfloat16, device=DEV).item() == 1.5
    assert float(xd[0, 0]) == float(x[0, 0])
    assert int(i[2]) == 6
    assert bool(xd[0, 0] == x[0, 0].item())
    # item waits for queued work
    acc = torch.zeros((), device=DEV)
    for k in range(50):
        acc += k
    assert acc.item() == sum(range(50))
    with pytest.raises(RuntimeError):
        xd.item()


def test_cat_stack_and_friends():
    a, b = rand(2, 3, seed=112), rand(4, 3, seed=113)
    check(lambda x, y: torch.cat([x, y]), a, b, exact=True)
    check(lambda x, y: torch.cat([x.t(), y.t()], dim=1), a, b, exact=True)
    check(lambda x: torch.cat([x, torch.empty(0, 3, device=x.device)]), a, exact=True)
    check(lambda x: torch.cat([x, x.int()]), a, exact=True)  # promotes
    check(lambda x: torch.stack([x, x * 2, x * 3], dim=1), a, exact=True)
    check(lambda x, y: torch.hstack([x.t(), y.t()]), a, b, exact=True)
    check(lambda x, y: torch.vstack([x, y]), a, b, exact=True)
    check(lambda x: x.repeat(2, 3), a, exact=True)
    check(lambda x: x.tile((2,)), a, exact=True)
    check(lambda x: torch.broadcast_tensors(x, x[:1])[1], a, exact=True)
    check(lambda x: torch.meshgrid(x[0], x[1], indexing="ij"), a, exact=True)


def test_factories_on_device():
    compare(torch.arange(10, device=DEV), torch.arange(10), exact=True)
    compare(torch.arange(1.5, 7, 0.5, device=DEV), torch.arange(1.5, 7, 0.5), exact=True)
    compare(torch.arange(-3, 9, 2, dtype=torch.float64, device=DEV), torch.arange(-3, 9, 2, dtype=torch.float64), exact=True)
    compare(torch.linspace(-1, 1, 17, device=DEV), torch.linspace(-1, 1, 17), exact=True)
    compare(torch.logspace(0, 2, 5, device=DEV), torch.logspace(0, 2, 5), exact=True)
    compare(torch.zeros(3, 4, device=DEV), torch.zeros(3, 4), exact=True)
    compare(torch.ones(2, 5, dtype=torch.int64, device=DEV), torch.ones(2, 5, dtype=torch.int64), exact=True)
    compare(torch.full((2, 2), 3.25, device=DEV), torch.full((2, 2), 3.25), exact=True)
    compare(torch.full((3,), 7, device=DEV), torch.full((3,), 7), exact=True)  # int fill infers int64
    compare(torch.full((2,), True, device=DEV), torch.full((2,), True), exact=True)
    compare(torch.eye(4, device=DEV), torch.eye(4), exact=True)
    compare(torch.eye(3, 5, dtype=torch.bool, device=DEV), torch.eye(3, 5, dtype=torch.bool), exact=True)
    compare(torch.tensor([[1, 2], [3, 4]], device=DEV), torch.tensor([[1, 2], [3, 4]]), exact=True)
    x = rand(3, 4, seed=114)
    compare(torch.zeros_like(x.to(DEV)), torch.zeros_like(x), exact=True)
    compare(torch.ones_like(x.to(DEV), dtype=torch.float16), torch.ones_like(x, dtype=torch.float16), exact=True)
    compare(torch.full_like(x.to(DEV), -2), torch.full_like(x, -2), exact=True)
    compare(x.to(DEV).new_zeros(2), x.new_zeros(2), exact=True)
    compare(x.to(DEV).new_tensor([1.0, 2.0]), x.new_tensor([1.0, 2.0]), exact=True)
    compare(torch.tril_indices(4, 4, device=DEV), torch.tril_indices(4, 4), exact=True)
    e = torch.empty(3, 4, device=DEV)
    assert e.shape == (3, 4) and e.device.type == "neuron" and e.dtype == torch.float32
    assert torch.empty_strided((2, 3), (1, 2), device=DEV).stride() == (1, 2)
    expected = torch.ones(2)
    with torch.device(DEV):
        compare(torch.ones(2), expected, exact=True)
        compare(torch.arange(3), torch.arange(3, device="cpu"), exact=True)


DTYPE_CASES = [torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16, torch.float16, torch.complex64, torch.uint8]


@pytest.mark.parametrize("dtype", DTYPE_CASES, ids=str)
def test_dtypes_basic_ops(dtype):
    a = rand(4, 5, dtype=dtype, seed=115)
    b = rand(4, 5, dtype=dtype, seed=116)
    low = dtype in (torch.bfloat16, torch.float16)
    tol = dict(atol=1e-2, rtol=1e-2) if low else {}
    exact = not (dtype.is_floating_point or dtype.is_complex)
    if dtype == torch.bool:
        check(torch.logical_or, a, b, exact=True)
        check(torch.bitwise_and, a, b, exact=True)
        check(lambda x: x.sum(), a, exact=True)
        check(lambda x: x.any(0), a, exact=True)
    else:
        check(torch.add, a, b, exact=exact, **tol)
        check(torch.mul, a, b, exact=exact, **tol)
        check(lambda x: x * 2 - 1, a, exact=exact, **tol)
        check(lambda x: x.sum(1), a, exact=exact, **tol)
        check(torch.eq, a, b, exact=True)
        if not dtype.is_complex:
            check(torch.maximum, a, b, exact=True)
            check(lambda x: tuple(x.sort(dim=1, stable=True)), a, exact=True)
            check(lambda x: x.cumsum(1), a, exact=exact, **tol)
        if dtype.is_floating_point or dtype.is_complex:
            check(torch.matmul, a, b.t(), **tol)
            check(torch.exp, a, **tol)
    check(lambda x: x.t().contiguous(), a, exact=True)
    check(lambda x: x[1:3, ::2], a, exact=True)
    check(lambda x, y: torch.where(x == y, x, y), a, b, exact=True)
    check(lambda x: torch.cat([x, x]), a, exact=True)
    check(lambda x: x.to(torch.float32), a, exact=True)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 4, 2)], ids=str)
def test_zero_dim_and_empty(shape):
    x = rand(*shape, seed=117)
    check(lambda t: t * 2 + 1, x, exact=True)
    check(lambda t: t.sum(), x, exact=True)
    check(lambda t: t.exp(), x, exact=True)
    check(lambda t: t.reshape(-1), x, exact=True)
    check(lambda t: torch.cat([t.reshape(-1), t.reshape(-1)]), x, exact=True)
    check(lambda t: t.clone(), x, exact=True)
    check(lambda t: t.prod(), x, exact=True)
    check(lambda t: t.mean(), x)  # nan for empty: equal_nan
    if x.dim() >= 2:
        check(lambda t: t.sum(-1), x, exact=True)
        check(lambda t: t.amax(0) if t.shape[0] else t.sum(0), x, exact=True)
    if x.numel() == 0:
        # CPU raises at the call; on neuron the kernel fails on the queue and the
        # error surfaces at the next synchronization (the asynchronous contract).
        with pytest.raises(RuntimeError, match="max"):
            x.to(DEV).max().cpu()
    else:
        check(lambda t: t.max(), x, exact=True)
        assert x.to(DEV).item() == x.item()


def test_scalar_tensor_with_host_zero_dim():
    s = torch.tensor(2.5)
    x = rand(3, seed=118)
    compare(x.to(DEV) * s, x * s, exact=True)   # 0-dim CPU tensor operand
    compare(s * x.to(DEV), s * x, exact=True)
    compare(torch.tensor(3.0, device=DEV) + x.to(DEV), 3.0 + x, exact=True)


def test_resize_():
    x = torch.arange(12.0)
    xd = x.to(DEV)
    xd.resize_(3, 4)
    assert xd.shape == (3, 4)
    compare(xd, x.view(3, 4), exact=True)
    xd.resize_(2, 3)  # shrink keeps the leading elements
    compare(xd, x[:6].view(2, 3), exact=True)
    xd.resize_(5, 5)  # grow keeps the old elements and reallocates storage
    assert xd.shape == (5, 5)
    assert xd.untyped_storage().nbytes() >= 25 * 4
    compare(xd.flatten()[:12], x, exact=True)
    xd.fill_(1.0)
    compare(xd, torch.ones(5, 5), exact=True)
    e = torch.empty(0, device=DEV)
    e.resize_(4).copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    compare(e, torch.tensor([1.0, 2.0, 3.0, 4.0]), exact=True)
    z = torch.zeros(2, 2, device=DEV)
    z.resize_as_(torch.empty(3, 1))
    assert z.shape == (3, 1)


def test_resize_after_queued_work():
    x = torch.zeros(1000, device=DEV)
    for _ in range(10):
        x += 1
    x.resize_(3000)  # grows while adds may still be queued: old values survive
    compare(x[:1000], torch.full((1000,), 10.0), exact=True)


def test_set_and_storage_sharing():
    a = torch.arange(8.0, device=DEV)
    b = torch.empty(0, device=DEV)
    b.set_(a.untyped_storage(), 2, (2, 3), (3, 1))
    compare(b, torch.arange(8.0).as_strided((2, 3), (3, 1), 2), exact=True)
    b.zero_()
    compare(a, torch.tensor([0.0, 1, 0, 0, 0, 0, 0, 0]), exact=True)


def test_metrics_count_async_and_sync_ops():
    x = torch.randn(16, 16).to(DEV)
    torch.nonzero(torch.tanh(x) > 0)  # warm-up: the first call of an op per dtype signature may run inline
    torch.neuron.synchronize()
    torch_neuronx.reset_metrics()
    y = torch.tanh(x)
    m = torch_neuronx.metrics()
    assert m["ops"]["aten::tanh"]["async"] == 1
    assert m["ops"]["aten::tanh"].get("sync", 0) == 0
    nz = torch.nonzero(y > 0)
    m = torch_neuronx.metrics()
    assert sum(v.get("sync", 0) for k, v in m["ops"].items() if k.startswith("aten::nonzero")) == 1
    assert m["syncs"]["data_dependent"] == 1
    assert nz.shape[0] == int((torch.tanh(x.cpu()) > 0).sum())
    torch_neuronx.reset_metrics()
    assert all(sum(v.values()) == 0 for v in torch_neuronx.metrics()["ops"].values())
    y.view(-1).t()  # views launch nothing
    m = torch_neuronx.metrics()
    assert sum(v.get("async", 0) + v.get("sync", 0) for v in m["ops"].values()) == 0


def run_isolated(code):
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"exit code {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}"


def test_conj_and_neg_views_as_operands():
    # lazily conjugated / negated neuron tensors used as op inputs (isolated: a crash must only fail this test)
    run_isolated("""
        import torch
        z = torch.randn(3, 4, dtype=torch.complex64, generator=torch.Generator().manual_seed(0))
        zd = z.to("neuron")
        assert torch.equal((zd.conj() * 2).cpu(), z.conj() * 2)
        assert torch.equal((zd.conj() @ zd.t()).cpu(), z.conj() @ z.t())
        assert torch.equal(zd.conj().clone().cpu().resolve_conj(), z.conj().resolve_conj())
        assert torch.equal(zd.conj().imag.cpu().resolve_neg(), z.conj().imag.resolve_neg())
    """)


# ----------------------------------------------------------------------------- more ops: linalg, fft, misc

def _spd(seed):
    a = rand(4, 4, seed=seed)
    return a @ a.t() + 4 * torch.eye(4)


MORE_OPS = {
    "linalg_solve": (lambda s, b: torch.linalg.solve(s, b), lambda: (_spd(200), rand(4, 2, seed=201))),
    "linalg_inv": (torch.linalg.inv, lambda: (_spd(202),)),
    "linalg_det": (torch.linalg.det, lambda: (_spd(203),)),
    "linalg_slogdet": (lambda s: tuple(torch.linalg.slogdet(s)), lambda: (_spd(204),)),
    "linalg_cholesky": (torch.linalg.cholesky, lambda: (_spd(205),)),
    "linalg_eigvalsh": (torch.linalg.eigvalsh, lambda: (_spd(206),)),
    "linalg_svdvals": (torch.linalg.svdvals, lambda: (rand(5, 3, seed=207),)),
    "linalg_qr_abs": (lambda a: torch.linalg.qr(a).R.abs(), lambda: (rand(5, 3, seed=208),)),
    "linalg_lstsq": (lambda a, b: torch.linalg.lstsq(a, b).solution, lambda: (_spd(209), rand(4, 2, seed=210))),
    "linalg_matrix_norm": (torch.linalg.matrix_norm, lambda: (rand(3, 4, seed=211),)),
    "linalg_cross": (torch.linalg.cross, lambda: (rand(4, 3, seed=212), rand(4, 3, seed=213))),
    "cdist": (torch.cdist, lambda: (rand(5, 3, seed=214), rand(4, 3, seed=215))),
    "fft": (torch.fft.fft, lambda: (rand(3, 8, seed=216),)),
    "rfft_irfft": (lambda a: torch.fft.irfft(torch.fft.rfft(a), n=8), lambda: (rand(3, 8, seed=217),)),
    "ifft2_complex": (torch.fft.ifft2, lambda: (rand(4, 4, dtype=torch.complex64, seed=218),)),
    "histc": (lambda a: torch.histc(a, 5), lambda: (rand(30, seed=219),)),
    "searchsorted": (torch.searchsorted, lambda: (torch.arange(10.0), rand(3, 4, seed=220) * 5)),
    "bucketize": (torch.bucketize, lambda: (rand(3, 4, seed=221), torch.tensor([-1.0, 0.0, 1.0]))),
    "one_hot_inferred": (F.one_hot, lambda: (torch.tensor([0, 3, 1]),)),
    "one_hot_n": (lambda i: F.one_hot(i, 6), lambda: (torch.tensor([[0, 5], [1, 1]]),)),
    "where_single_arg": (lambda a: torch.where(a > 0), lambda: (rand(4, 5, seed=222),)),
    "isin": (torch.isin, lambda: (rand(4, 4, seed=223).round(), torch.tensor([0.0, 1.0]))),
    "clamp_tensor_bounds": (torch.clamp, lambda: (rand(3, 4, seed=224), -rand(4, seed=225).abs(), rand(4, seed=226).abs())),
    "channels_last": (lambda a: a.contiguous(memory_format=torch.channels_last) * 2, lambda: (rand(2, 3, 4, 5, seed=227),)),
    "equal": (lambda a, b: (torch.equal(a, a.clone()), torch.equal(a, b)), lambda: (rand(3, seed=228), rand(3, seed=229))),
    "allclose": (lambda a: (torch.allclose(a, a + 1e-9), torch.allclose(a, a + 1)), lambda: (rand(3, seed=230),)),
    "diff": (torch.diff, lambda: (rand(3, 6, seed=231),)),
    "kron": (torch.kron, lambda: (rand(2, 2, seed=232), rand(2, 3, seed=233))),
    "tensordot": (lambda a, b: torch.tensordot(a, b, dims=([1, 2], [0, 1])), lambda: (rand(2, 3, 4, seed=234), rand(3, 4, 5, seed=235))),
    "polar": (torch.polar, lambda: (rand(4, seed=236).abs(), rand(4, seed=237))),
    "nanmean_nansum": (lambda a: (torch.nanmean(a.log()), torch.nansum(a.log(), 1)), lambda: (rand(3, 4, seed=238),)),
    "quantile": (lambda a: torch.quantile(a, torch.tensor([0.25, 0.5], device=a.device), dim=1), lambda: (rand(3, 7, seed=239),)),
    "mode": (lambda a: tuple(torch.mode(a.round(), 1)), lambda: (rand(4, 9, seed=240),)),
    "logcumsumexp": (lambda a: a.logcumsumexp(1), lambda: (rand(3, 5, seed=241),)),
    "grid_sample": (lambda a, g: F.grid_sample(a, g, align_corners=False), lambda: (rand(1, 2, 5, 5, seed=242), rand(1, 3, 3, 2, seed=243).tanh())),
    "F_unfold_fold": (lambda a: F.fold(F.unfold(a, 2), (4, 4), 2), lambda: (rand(1, 2, 4, 4, seed=244),)),
    "pixel_shuffle": (lambda a: F.pixel_shuffle(a, 2), lambda: (rand(1, 8, 3, 3, seed=245),)),
    "ctc_loss": (lambda lp: F.ctc_loss(lp, torch.tensor([[1, 2, 2]]), torch.tensor([6]), torch.tensor([3])),
                 lambda: (rand(6, 1, 4, seed=246).log_softmax(2),)),
    "cosine_similarity": (F.cosine_similarity, lambda: (rand(4, 5, seed=247), rand(4, 5, seed=248))),
    "topk_large": (lambda a: tuple(a.topk(5)), lambda: (rand(1000, seed=249),)),
    "sort_stable_many_ties": (lambda a: tuple(a.sort(stable=True)), lambda: (torch.randint(0, 3, (200,), generator=gen(250)),)),
    "argmax_ties_first_index": (lambda a: (a.argmax(1), a.max(1).indices), lambda: (torch.zeros(3, 4),)),
    "complex_matmul_mH": (lambda a: a @ a.mH, lambda: (rand(3, 3, dtype=torch.complex64, seed=251),)),
    "dropout_eval": (lambda a: F.dropout(a, 0.5, training=False), lambda: (rand(4, 4, seed=252),)),
    "dropout_p0": (lambda a: F.dropout(a, 0.0, training=True), lambda: (rand(4, 4, seed=253),)),
}


@pytest.mark.parametrize("name", sorted(MORE_OPS))
def test_more_ops(name):
    fn, make_args = MORE_OPS[name]
    check(fn, *make_args(), atol=1e-4, rtol=1e-4)


def _rnn_twin(cls, **kw):
    torch.manual_seed(0)
    m = cls(**kw)
    d = cls(**kw).to(DEV)
    d.load_state_dict(m.state_dict())
    return m, d


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU", "LSTM_bidirectional_2layer"])
def test_recurrent_modules(kind):
    cls = {"RNN": torch.nn.RNN, "LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "LSTM_bidirectional_2layer": torch.nn.LSTM}[kind]
    kw = dict(input_size=4, hidden_size=3)
    if kind == "LSTM_bidirectional_2layer":
        kw.update(num_layers=2, bidirectional=True, batch_first=True)
    m, d = _rnn_twin(cls, **kw)
    x = rand(5, 2, 4, seed=254)
    out, hidden = m(x)
    out_d, hidden_d = d(x.to(DEV))
    compare(out_d, out, atol=1e-5, rtol=1e-5)
    compare(hidden_d, hidden, atol=1e-5, rtol=1e-5)
    cell = {"RNN": torch.nn.RNNCell, "LSTM": torch.nn.LSTMCell, "GRU": torch.nn.GRUCell}.get(kind)
    if cell is not None:
        c, cd = _rnn_twin(cell, input_size=4, hidden_size=3)
        compare(cd(x[0].to(DEV)), c(x[0]), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(torch.neuron.device_count() < 2, reason="needs two neuron devices")
def test_ops_on_second_device():
    x = rand(4, 5, seed=255)
    a = x.to("neuron:1")
    assert torch.neuron.current_device() == 0
    y = (a @ a.t()).relu() + a.sum()
    assert y.device == torch.device("neuron:1")
    torch.testing.assert_close(y.cpu(), (x @ x.t()).relu() + x.sum())
    nz = torch.nonzero(a > 0)  # sync path on the other device
    assert nz.device == torch.device("neuron:1")
    assert torch.equal(nz.cpu(), torch.nonzero(x > 0))
    with pytest.raises(RuntimeError, match="same device"):
        a + x.to("neuron:0")


def test_repr_shows_values_and_device():
    x = torch.tensor([1.5, -2.0])
    s = repr(x.to(DEV))
    assert "1.5000" in s and "-2.0000" in s and "device='neuron:0'" in s
    assert str(torch.tensor(3, device=DEV)) == "tensor(3, device='neuron:0')"


def test_numpy_requires_cpu():
    x = rand(3, seed=256)
    with pytest.raises(TypeError, match="cpu"):
        x.to(DEV).numpy()
    assert x.to(DEV).cpu().numpy().tolist() == x.numpy().tolist()


OVERLAPPING_WRITES = {
    "expand_add_": lambda a: a[:, :1].expand(4, 4).add_(1),
    "expand_copy_": lambda a: a[:, :1].expand(4, 4).copy_(torch.ones(4, 4, device=a.device)),
    "shifted_copy_": lambda a: a.view(-1)[1:].copy_(a.view(-1)[:-1]),
    "transposed_copy_": lambda a: a.copy_(a.t()),
    "transposed_add_": lambda a: a.add_(a.t()),
    "add_out_shifted": lambda a: torch.add(a[1:], 1, out=a[:-1]),
    "mul_out_transposed_self": lambda a: torch.mul(a.t(), 2, out=a),
    "cat_out_input": lambda a: torch.cat([a[:2], a[2:]], out=a),
    "index_select_out_self": lambda a: torch.index_select(a, 0, torch.tensor([3, 2, 1, 0], device=a.device), out=a),
    "gather_out_self": lambda a: torch.gather(a, 1, torch.zeros(4, 4, dtype=torch.long, device=a.device), out=a),
    "index_put_values_alias_self": lambda a: a.index_put_((torch.tensor([0, 1], device=a.device),), a[1:3]),
}


@pytest.mark.parametrize("name", sorted(OVERLAPPING_WRITES))
def test_overlapping_writes_raise_like_cpu(name):
    # CPU refuses writes whose output overlaps an input (or itself); neuron must not silently compute garbage.
    # The error may surface at the next synchronization (asynchronous kernels).
    f = OVERLAPPING_WRITES[name]
    with pytest.raises(RuntimeError, match="single memory location"):
        f(torch.arange(16.0).view(4, 4))
    a = torch.arange(16.0, device=DEV).view(4, 4)
    with pytest.raises(RuntimeError, match="single memory location"):
        f(a)
        torch.neuron.synchronize()
    # the device stays usable afterwards
    compare(torch.arange(3.0, device=DEV) * 2, torch.arange(3.0) * 2, exact=True)


def test_out_aliasing_input():
    a, b = rand(3, 4, seed=257), rand(3, 4, seed=258)
    ad, bd = a.to(DEV), b.to(DEV)
    torch.add(ad, bd, out=ad)
    torch.add(a, b, out=a)
    compare(ad, a, exact=True)
    torch.mul(ad, ad, out=bd)
    torch.mul(a, a, out=b)
    compare(bd, b, exact=True)


def _busy_queue():
    big = torch.randn(300, 300, device=DEV)
    for _ in range(3):
        big = (big @ big).tanh()
    return big


def test_host_operands_captured_at_launch():
    # host tensors used by a queued kernel may be changed by the user right after the call
    keep = _busy_queue()
    xd = torch.arange(10.0, device=DEV)
    idx = torch.tensor([0, 1])
    y = xd[idx]
    idx.fill_(5)
    s = torch.tensor(2.0)
    z = xd * s
    s.fill_(100.0)
    m = torch.tensor([True, False] * 5)
    w = xd.masked_fill(m.to(DEV), -1.0)
    m.fill_(False)
    compare(y, torch.tensor([0.0, 1.0]), exact=True)
    compare(z, torch.arange(10.0) * 2, exact=True)
    compare(w, torch.tensor([-1.0, 1, -1, 3, -1, 5, -1, 7, -1, 9]), exact=True)
    assert keep.shape == (300, 300)


def test_stream_order_read_before_write():
    keep = _busy_queue()
    x = torch.ones(1000, device=DEV)
    y = x * 2          # reads x
    x.add_(5)          # then writes x
    v = x.view(10, 100)
    v[0].zero_()       # writes through a view
    z = x.sum()
    compare(y, torch.full((1000,), 2.0), exact=True)
    expected = torch.full((1000,), 6.0)
    expected[:100] = 0
    compare(x, expected, exact=True)
    assert z.item() == 900 * 6.0
    assert keep.shape == (300, 300)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("param_dtype", ["same", "float32"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_batch_norm_low_precision(dtype, param_dtype, train):
    # model.bfloat16() gives low-precision parameters and running stats; autocast-style keeps them in float32
    pdt = dtype if param_dtype == "same" else torch.float32
    x = rand(4, 3, 5, seed=260).to(dtype)
    rm, rv = rand(3, seed=261).to(pdt), (rand(3, seed=262).abs() + 0.5).to(pdt)
    w, b = rand(3, seed=263).to(pdt), rand(3, seed=264).to(pdt)
    rm_d, rv_d = rm.to(DEV), rv.to(DEV)
    y_d = F.batch_norm(x.to(DEV), rm_d, rv_d, w.to(DEV), b.to(DEV), training=train, momentum=0.2)
    y = F.batch_norm(x, rm, rv, w, b, training=train, momentum=0.2)
    compare(y_d, y, atol=1e-2, rtol=1e-2)
    compare(rm_d, rm, atol=1e-3, rtol=1e-3)
    compare(rv_d, rv, atol=1e-3, rtol=1e-3)


def test_native_batch_norm_eval_output_metadata():
    # in eval mode CPU returns empty save_mean/save_invstd; neuron must match, on the first call too
    x = rand(2, 3, seed=265)
    rm, rv = torch.zeros(3), torch.ones(3)
    e = torch.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5)
    a = torch.native_batch_norm(x.to(DEV), None, None, rm.to(DEV), rv.to(DEV), False, 0.1, 1e-5)
    compare(a, e)
    e = torch._native_batch_norm_legit(x, None, None, rm, rv, False, 0.1, 1e-5)
    a = torch._native_batch_norm_legit(x.to(DEV), None, None, rm.to(DEV), rv.to(DEV), False, 0.1, 1e-5)
    compare(a, e)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.complex128], ids=str)
def test_linalg_solve_right_side(dtype):
    # left=False solves X A = B
    a = rand(3, 3, dtype=dtype, seed=266) + 3 * torch.eye(3, dtype=dtype)
    b = rand(4, 3, dtype=dtype, seed=267)
    check(lambda x, y: torch.linalg.solve(x, y, left=False), a, b, atol=1e-5, rtol=1e-5)
    check(lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, left=False), a, b, atol=1e-5, rtol=1e-5)
    check(lambda x, y: torch.linalg.lu_solve(*torch.linalg.lu_factor(x), y, left=False, adjoint=True), a, b,
          atol=1e-5, rtol=1e-5)
    check(lambda x, y: torch.linalg.solve(x, y.mT), a, b, atol=1e-5, rtol=1e-5)


def test_conj_physical_inplace():
    z = rand(3, 4, dtype=torch.complex64, seed=268)
    zd = z.to(DEV)
    zd.conj_physical_()
    compare(zd, z.conj_physical(), exact=True)
    zd.t().conj_physical_()  # on a non-contiguous view
    compare(zd, z, exact=True)
    r = rand(5, seed=269)
    rd = r.to(DEV)
    rd.conj_physical_()  # real: no-op
    compare(rd, r, exact=True)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_takes_cpus_flash_kernel_bitwise(causal):
    # neuron answers SDPA's backend choice like CPU and runs CPU's flash kernel through the
    # overrideable ops: no T x T attention matrix, results and gradients bitwise equal to CPU.
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16, requires_grad=True) for _ in range(3))
    qd, kd, vd = (t.detach().to(DEV).requires_grad_() for t in (q, k, v))
    torch_neuronx.reset_metrics()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out_d = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
    out.square().sum().backward()
    out_d.square().sum().backward()
    assert torch.equal(out_d.cpu(), out)
    for a, b in ((qd, q), (kd, k), (vd, v)):
        assert torch.equal(a.grad.cpu(), b.grad)
    ops = torch_neuronx.metrics()["ops"]
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ops
    assert "aten::bmm" not in ops


# --- Semantics the conformance sweep (python -m torch_neuronx.conformance) found wrong ---


@pytest.mark.parametrize("op", ["add_", "clamp_max_", "mul_"])
def test_inplace_broadcast_that_would_grow_self_raises_as_on_cpu(op):
    a, b = rand(5, 1, seed=1), rand(5, 5, seed=2)
    with pytest.raises(RuntimeError) as cpu_err:
        getattr(a.clone(), op)(b)
    x = a.to(DEV)
    with pytest.raises(RuntimeError) as dev_err:
        getattr(x, op)(b.to(DEV))
    assert str(dev_err.value).splitlines()[0] == str(cpu_err.value).splitlines()[0]
    assert x.shape == (5, 1)  # self kept its shape and values
    compare(x, a, exact=True)


def test_inplace_addr_on_0d_self_raises_as_on_cpu():
    with pytest.raises(RuntimeError, match="2D tensor expected"):
        torch.tensor(1.0).addr_(torch.ones(2), torch.ones(3))
    s = torch.tensor(1.0, device=DEV)
    with pytest.raises(RuntimeError, match="2D tensor expected"):
        s.addr_(torch.ones(2, device=DEV), torch.ones(3, device=DEV))
    assert s.shape == () and s.item() == 1.0


def test_host_bool_mask_values_decide_the_shape_every_call():
    g = rand(5, 5, seed=3)
    d = g.to(DEV)
    for mask in ([True, False, True, False, False], [False] * 5, [True] * 5, [False, True, False, False, False]):
        m = torch.tensor(mask)
        compare(d[m], g[m], exact=True)
        v = rand(5, seed=4)
        compare(torch.index_put(d, (m,), v.to(DEV), accumulate=True), torch.index_put(g, (m,), v, accumulate=True),
                exact=True)


@pytest.mark.parametrize("call", [
    lambda dev: torch.narrow_copy(torch.ones(3, 4, device=dev), 5, 0, 1),
    lambda dev: torch.narrow_copy(torch.ones(10, device=dev), 0, 11, 1),
    lambda dev: torch.ones(3, 4, device=dev).index_select(0, torch.tensor([5], device=dev)),
    lambda dev: torch.ones(3, device=dev).view(2, 2),
    lambda dev: torch.ones(2, 3, device=dev) @ torch.ones(2, 3, device=dev),
], ids=["narrow_copy-dim", "narrow_copy-start", "index_select-index", "view", "matmul"])
def test_errors_are_cpus_errors(call):
    # Whatever the meta kernel says, neuron raises what CPU's kernel raises.
    with pytest.raises(Exception) as cpu_err:
        call("cpu")
    with pytest.raises(Exception) as dev_err:
        call(DEV)
        torch.neuron.synchronize()
    assert type(dev_err.value) is type(cpu_err.value)
    assert str(cpu_err.value).splitlines()[0] in str(dev_err.value)


def strides_match_cpu(fn, *inputs):
    expected = fn(*inputs)
    actual = fn(*(i.to(DEV) for i in inputs))
    exp = expected if isinstance(expected, (tuple, list)) else (expected,)
    act = actual if isinstance(actual, (tuple, list)) else (actual,)
    for e, a in zip(exp, act):
        assert a.stride() == e.stride(), (a.stride(), e.stride())
        compare(a, e)


def test_output_strides_match_cpu_where_meta_and_cpu_kernels_differ():
    x = rand(5, 5, 5, seed=5)
    strides_match_cpu(lambda t: torch.rot90(t, -5, (0, 1)), x)
    strides_match_cpu(lambda t: t.flip(0).transpose_(0, 1), x)
    strides_match_cpu(lambda t: torch.fft.rfftn(t), rand(2, 3, 4, seed=6))
    strides_match_cpu(lambda t: torch.linalg.eig(t).eigenvalues.abs().sort().values, rand(4, 4, seed=7))
    strides_match_cpu(lambda t: torch.linalg.eig(t).eigenvectors.abs(), rand(4, 4, seed=7))


@pytest.mark.parametrize("fn", [
    lambda t, out: torch.fft.ifft(t, out=out),
    lambda t, out: torch.linalg.inv(t, out=out),
], ids=["fft.ifft", "linalg.inv"])
def test_out_resize_takes_the_cpu_kernels_layout(fn):
    x = rand(4, 4, seed=8).to(torch.complex64)
    for shape_from in (x, rand(3, 3, seed=9).to(torch.complex64), x):  # a new signature, then a cached one
        cpu_out = torch.empty(0, dtype=torch.complex64)
        fn(shape_from, cpu_out)
        dev_out = torch.empty(0, dtype=torch.complex64, device=DEV)
        fn(shape_from.to(DEV), dev_out)
        assert dev_out.stride() == cpu_out.stride()
        compare(dev_out, cpu_out)


def test_out_resize_grows_storage_keeping_results():
    # The sync path grows the out= storage; the old bytes must not land over the result.
    for _ in range(3):
        out = torch.empty(2, device=DEV)
        a, b = rand(30, 4, seed=10), rand(30, 4, seed=11)
        torch.mul(a.to(DEV), b.to(DEV), out=out)
        compare(out, a * b, exact=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_norms_run_cpus_fused_kernels(dtype):
    x, w, b = rand(4, 8, 16, seed=12).to(dtype), rand(16, seed=13).to(dtype), rand(16, seed=14).to(dtype)
    compare(F.layer_norm(x.to(DEV), (16,), w.to(DEV), b.to(DEV)), F.layer_norm(x, (16,), w, b), exact=True)
    compare(F.group_norm(x.to(DEV), 4), F.group_norm(x, 4), exact=True)
    v1, v2 = rand(5, seed=15).to(dtype), rand(6, seed=16).to(dtype)
    m = rand(5, 6, seed=17).to(dtype)
    compare(torch.addr(m.to(DEV), v1.to(DEV), v2.to(DEV)), torch.addr(m, v1, v2), exact=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_histc_counts_integer_inputs_as_cuda_does(dtype):
    # CPU's histc takes floating point only; CUDA (and Hugging Face's MoE routing on any
    # accelerator) counts integer inputs and returns counts of the input's dtype.
    x = torch.randint(0, 9, (257,), dtype=dtype, generator=torch.Generator().manual_seed(0))
    expected = torch.histc(x.double(), bins=9, min=0, max=8).to(dtype)
    got = torch.histc(x.to("neuron"), bins=9, min=0, max=8)
    assert got.dtype == dtype and torch.equal(got.cpu(), expected)
    auto_range = torch.histc(x.to("neuron"), bins=4)  # min=max=0: the data's range
    assert torch.equal(auto_range.cpu(), torch.histc(x.double(), bins=4).to(dtype))
    out = torch.empty(0, dtype=dtype, device="neuron")
    torch.histc(x.to("neuron"), bins=9, min=0, max=8, out=out)
    assert torch.equal(out.cpu(), expected)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.histc(x.to("neuron"), bins=3, out=torch.empty(0, device="neuron"))
    floats = torch.randn(100)
    assert torch.equal(torch.histc(floats.to("neuron"), bins=7).cpu(), torch.histc(floats, bins=7))
