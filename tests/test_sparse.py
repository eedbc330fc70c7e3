"""Sparse tensors on neuron, compared with CPU: COO construction, conversion, arithmetic, sparse
embedding gradients and SparseAdam; compressed layouts (CSR/CSC/BSR)."""
import pytest
import torch

import torch_neuronx  # noqa: F401

DEV = "neuron"


def coo():
    i = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    v = torch.tensor([3.0, 4.0, 5.0, 1.0])
    return torch.sparse_coo_tensor(i, v, (2, 3))


def same(dev, cpu):
    assert dev.device.type == "neuron" and dev.layout == cpu.layout
    if cpu.is_sparse:
        assert dev.is_coalesced() == cpu.is_coalesced()
        torch.testing.assert_close(dev.cpu().to_dense(), cpu.to_dense(), rtol=0, atol=0)
    else:
        torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)


def test_construct_move_and_convert():
    s = coo()
    d = s.to(DEV)
    assert d.is_sparse and d._nnz() == 4 and d._indices().device.type == "neuron"
    same(d, s)
    same(torch.sparse_coo_tensor(s._indices(), s._values(), (2, 3), device=DEV), s)
    same(d.coalesce(), s.coalesce())
    same(d.to_dense(), s.to_dense())
    dense = torch.randn(4, 5)
    dense[dense < 0.3] = 0
    same(dense.to(DEV).to_sparse(), dense.to_sparse())
    back = d.cpu()
    assert back.is_sparse and back.device.type == "cpu"
    same(torch.empty(2, 2, device=DEV, layout=torch.sparse_coo), torch.empty(2, 2, layout=torch.sparse_coo))


def test_arithmetic_and_matmul():
    s, m = coo(), torch.randn(3, 4)
    d = s.to(DEV)
    same(d + d, s + s)
    same(d * 2, s * 2)
    same(torch.sparse.mm(d, m.to(DEV)), torch.sparse.mm(s, m))
    same(d.coalesce().sum(), s.coalesce().sum())
    x = torch.randn(2, 3)
    same(x.to(DEV).add_(d), x.clone().add_(s))
    same(x.to(DEV).sparse_mask(d.coalesce()), x.sparse_mask(s.coalesce()))


@pytest.mark.parametrize("steps", [3])
def test_sparse_embedding_gradients_and_sparse_adam_match_cpu(steps):
    torch.manual_seed(0)
    ref = torch.nn.Embedding(12, 4, sparse=True)
    dev = torch.nn.Embedding(12, 4, sparse=True)
    dev.load_state_dict(ref.state_dict())
    dev.to(DEV)
    opt_r = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    opt_d = torch.optim.SparseAdam(dev.parameters(), lr=0.05)
    for step in range(steps):
        idx = torch.randint(0, 12, (7,), generator=torch.Generator().manual_seed(step))
        for m, opt, i in ((ref, opt_r, idx), (dev, opt_d, idx.to(DEV))):
            opt.zero_grad()
            m(i).pow(2).sum().backward()
            opt.step()
        assert dev.weight.grad.is_sparse and dev.weight.grad.device.type == "neuron"
    torch.testing.assert_close(dev.weight.detach().cpu(), ref.weight.detach(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_sparse_compressed_layouts_match_cpu(layout):
    dense = torch.randn(4, 6)
    dense[dense < 0.2] = 0
    convert = {"csr": lambda t: t.to_sparse_csr(), "csc": lambda t: t.to_sparse_csc(),
               "bsr": lambda t: t.to_sparse_bsr((2, 2))}[layout]
    ref = convert(dense)
    dev = convert(dense.to(DEV))
    assert dev.layout == ref.layout and dev.device.type == "neuron" and dev.values().device.type == "neuron"
    torch.testing.assert_close(dev.to_dense().cpu(), dense, rtol=0, atol=0)
    moved = ref.to(DEV)
    assert moved.layout == ref.layout
    torch.testing.assert_close(moved.cpu().to_dense(), dense, rtol=0, atol=0)
    if layout == "csr":
        m = torch.randn(6, 3)
        torch.testing.assert_close((dev @ m.to(DEV)).cpu(), ref @ m)
        torch.testing.assert_close(dev.crow_indices().cpu(), ref.crow_indices())


@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_csr_mm_reduce_backward_matches_cpu(reduce):
    # The CPU kernel computes the argmax its backward needs only when an input requires grad:
    # the host copies must say so (an empty argmax made the backward read out of bounds).
    dense = torch.randn(7, 7)
    dense[dense < 0.3] = 0
    other = torch.randn(7, 3)
    grads = []
    for dev in ("cpu", DEV):
        a = dense.to(dev).to_sparse_csr().requires_grad_()
        b = other.to(dev).requires_grad_()
        out = torch.sparse.mm(a, b, reduce)
        ga, gb = torch.autograd.grad(out.sum(), (a, b))
        grads.append((out.detach().cpu(), ga.cpu().to_dense(), gb.cpu()))
    for x, y in zip(*grads):
        torch.testing.assert_close(y, x)
