"""NKI kernels from PyTorch: nki_op custom ops (eager, autograd, torch.compile, opcheck, in-place
arguments), the import aliases of the real packages, and the Gen-2 API."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_neuronx
from torch_neuronx import nki_op, wrap_nki
from torch_neuronx.nki import samples as S
import torch_neuronx.nki as nki
import torch_neuronx.nki.language as nl
import torch_neuronx.nki.typing as nt

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import clean_env  # noqa: E402


@nki.jit
def _fma_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(a.shape[0] // 128):
        x = nl.load(a[i * 128:(i + 1) * 128, :])
        y = nl.load(b[i * 128:(i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.multiply(nl.add(x, y), x))
    return out


@nki_op("nki_test::fma", mutates_args=())
def fma(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return wrap_nki(_fma_kernel)(a, b)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, g):
    a, b = ctx.saved_tensors
    return g * (2 * a + b), g * a


fma.register_autograd(_backward, setup_context=_setup)


@nki.jit
def _scale_inplace_kernel(x: nt.mutable_tensor, s):
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nl.store(x[i * 128:(i + 1) * 128, :], value=nl.multiply(t, s))
    return x


@nki_op("nki_test::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    wrap_nki(_scale_inplace_kernel)(x, s)


def test_nki_op_trains_under_autograd():
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 512)
    lin_n = torch.nn.Linear(512, 512).to("neuron")
    lin_n.load_state_dict(lin.state_dict())
    x = torch.randn(256, 512)
    opt, opt_n = torch.optim.SGD(lin.parameters(), 0.01), torch.optim.SGD(lin_n.parameters(), 0.01)
    for _ in range(3):
        for model, o, inp, op in ((lin, opt, x, lambda h, z: (h + z) * h), (lin_n, opt_n, x.to("neuron"), fma)):
            o.zero_grad()
            h = model(inp)
            loss = op(h, inp).square().mean()
            loss.backward()
            o.step()
    torch.testing.assert_close(lin_n.weight.detach().cpu(), lin.weight.detach(), atol=1e-5, rtol=1e-4)


def test_nki_op_inside_a_compiled_graph_is_one_call():
    from torch._dynamo.utils import counters
    a, b = torch.randn(256, 512), torch.randn(256, 512)
    counters.clear()

    def f(x, y):
        return torch.relu(fma(x * 2, y)) + 1
    cf = torch.compile(f, backend="neuron", fullgraph=True)
    r = cf(a.to("neuron"), b.to("neuron"))
    torch.testing.assert_close(r.cpu(), torch.relu((2 * a + b) * (2 * a)) + 1)
    assert sum(counters["graph_break"].values()) == 0


def test_nki_op_passes_opcheck_and_mutates_in_place():
    a, b = torch.randn(256, 512, device="neuron"), torch.randn(256, 512, device="neuron")
    torch.library.opcheck(fma, (a, b))
    x = torch.randn(384, 256)
    xn = x.to("neuron")
    scale_(xn, 3.0)
    torch.testing.assert_close(xn.cpu(), x * 3)
    torch.library.opcheck(scale_, (xn, 2.0))


def test_kernel_shows_in_the_profiler():
    a, b = torch.randn(256, 1024, device="neuron"), torch.randn(256, 1024, device="neuron")
    with torch.profiler.profile() as prof:
        S.tensor_add[2, 2](a, b)
        torch.neuron.synchronize()
    names = {e.name for e in prof.events()}
    assert "nki::launch" in names


def test_import_aliases_before_torch(tmp_path):
    src = tmp_path / "kern.py"
    src.write_text(
        "import numpy as np\n"
        "from neuronxcc import nki\n"
        "import neuronxcc.nki.language as nl\n"
        "from neuronxcc.nki.isa.constants import oob_mode\n"
        "@nki.jit(mode='simulation')\n"
        "def k(a):\n"
        "    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)\n"
        "    nl.store(out, value=nl.exp(nl.load(a)))\n"
        "    return out\n"
        "a = np.random.rand(128, 64).astype(np.float32)\n"
        "assert np.allclose(k(a), np.exp(a)), 'wrong'\n"
        "import sys; print('torch' in sys.modules, type(nki).__name__)\n")
    out = subprocess.run([sys.executable, str(src)], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "module"]
    off = subprocess.run([sys.executable, str(src)], env=clean_env(TORCH_NEURONX_NKI_ALIASES=0),
                         capture_output=True, text=True, timeout=120)
    assert "No module named 'neuronxcc'" in off.stderr


def test_gen2_api_dst_forms_and_ap():
    import torch_neuronx.nki.v2 as nki2
    import torch_neuronx.nki.v2.isa as nisa
    import torch_neuronx.nki.v2.language as nl2

    @nki2.jit
    def k(a, b):
        M, N = a.shape
        out = nl2.ndarray((M, N), dtype=a.dtype, buffer=nl2.shared_hbm)
        for m in nl2.affine_range(M // 128):
            x = nl2.ndarray((128, N), dtype=a.dtype, buffer=nl2.sbuf)
            y = nl2.ndarray((128, N), dtype=a.dtype, buffer=nl2.sbuf)
            nisa.dma_copy(dst=x, src=a[m * 128:(m + 1) * 128, :])
            nisa.dma_copy(dst=y, src=b.ap([[N, 128], [1, N]], offset=m * 128 * N))
            r = nl2.ndarray((128, N), dtype=a.dtype, buffer=nl2.sbuf)
            nisa.tensor_tensor(dst=r, data1=x, data2=y, op=nl2.add)
            s = nl2.ndarray((128, 1), dtype=nl2.float32, buffer=nl2.sbuf)
            nisa.tensor_reduce(dst=s, op=nl2.maximum, data=r, axis=1)
            nisa.tensor_scalar(dst=r, data=r, op0=nl2.subtract, operand0=s)
            nisa.dma_copy(dst=out[m * 128:(m + 1) * 128, :], src=r)
        return out
    a, b = np.random.rand(256, 96).astype(np.float32), np.random.rand(256, 96).astype(np.float32)
    out = nki2.simulate(k)(a, b)
    ref = a + b
    assert np.allclose(out, ref - ref.max(1, keepdims=True))
    t = nki2.simulate(k)(torch.from_numpy(a), torch.from_numpy(b))
    assert isinstance(t, torch.Tensor) and torch.allclose(t, torch.from_numpy(ref - ref.max(1, keepdims=True)))


def test_gen2_matmul_accumulate_auto_detect_and_lnc2():
    import torch_neuronx.nki.v2 as nki2
    import torch_neuronx.nki.v2.isa as nisa
    import torch_neuronx.nki.v2.language as nl2

    @nki2.jit
    def mm(lhsT, rhs):
        K, M = lhsT.shape
        _, N = rhs.shape
        out = nl2.ndarray((M, N), dtype=nl2.float32, buffer=nl2.shared_hbm)
        half = M // nl2.num_programs(0)
        for m in nl2.affine_range(half // 128):
            m0 = nl2.program_id(0) * half + m * 128
            acc = nl2.ndarray((128, N), dtype=nl2.float32, buffer=nl2.psum)
            for k in nl2.affine_range(K // 128):
                s = nl2.ndarray((128, 128), dtype=lhsT.dtype, buffer=nl2.sbuf)
                v = nl2.ndarray((128, N), dtype=rhs.dtype, buffer=nl2.sbuf)
                nisa.dma_copy(dst=s, src=lhsT[k * 128:(k + 1) * 128, m0:m0 + 128])
                nisa.dma_copy(dst=v, src=rhs[k * 128:(k + 1) * 128, :])
                nisa.nc_matmul(dst=acc, stationary=s, moving=v)  # first write overwrites, then adds
            r = nl2.ndarray((128, N), dtype=nl2.float32, buffer=nl2.sbuf)
            nisa.tensor_copy(dst=r, src=acc)
            nisa.dma_copy(dst=out[m0:m0 + 128, :], src=r)
        return out
    lhsT, rhs = np.random.rand(512, 512).astype(np.float32), np.random.rand(512, 256).astype(np.float32)
    out = nki2.simulate(mm[2])(lhsT, rhs)
    np.testing.assert_allclose(out, lhsT.T @ rhs, rtol=1e-4, atol=1e-3)


def test_torchneuron_nki_jit_name_and_gen2_broadcast():
    import torch_neuronx.nki.v2 as nki2
    import torch_neuronx.nki.v2.language as nl2

    k = torch_neuronx.nki_jit(_fma_kernel.func)
    a, b = torch.randn(128, 64), torch.randn(128, 64)
    torch.testing.assert_close(k(a.to("neuron"), b.to("neuron")).cpu(), (a + b) * a)

    @nki2.jit
    def bcast(x):
        t = nl2.load(x)
        out = nl2.ndarray((128, 64), dtype=x.dtype, buffer=nl2.shared_hbm)
        nl2.store(out, value=nl2.broadcast_to(t, (128, 64)))
        return out
    row = np.random.rand(1, 64).astype(np.float32)
    np.testing.assert_array_equal(nki2.simulate(bcast)(row), np.broadcast_to(row, (128, 64)))
