"""Quantized tensors on neuron (QuantizedPrivateUse1): made on the device, moved, viewed, and
computed on through the host's quantized kernels, against the same calls on CPU."""
import pytest
import torch

import torch_neuronx

DEV = torch.device("neuron")
QDTYPES = [torch.quint8, torch.qint8, torch.qint32]

pytestmark = pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated")


def same(got, want):
    assert got.device.type == "neuron" and got.is_quantized
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    assert got.qscheme() == want.qscheme()
    if want.qscheme() == torch.per_tensor_affine:
        assert (got.q_scale(), got.q_zero_point()) == (want.q_scale(), want.q_zero_point())
    torch.testing.assert_close(got.int_repr().cpu(), want.int_repr(), rtol=0, atol=0)


def sample(shape=(6, 7), seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("dtype", QDTYPES)
def test_quantize_a_device_tensor_and_back(dtype):
    x = sample()
    q = torch.quantize_per_tensor(x, 0.1, 5, dtype)
    qd = torch.quantize_per_tensor(x.to(DEV), 0.1, 5, dtype)
    same(qd, q)
    torch.testing.assert_close(qd.dequantize().cpu(), q.dequantize(), rtol=0, atol=0)
    assert qd.dequantize().device.type == "neuron"
    back = qd.cpu()
    assert back.device.type == "cpu" and back.is_quantized
    torch.testing.assert_close(back.int_repr(), q.int_repr(), rtol=0, atol=0)
    same(q.to(DEV), q)


def test_per_channel_and_tensor_qparams():
    x = sample((4, 5))
    scales, zps = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), torch.tensor([0, 1, 2, 3])
    q = torch.quantize_per_channel(x, scales, zps, 0, torch.qint8)
    qd = torch.quantize_per_channel(x.to(DEV), scales.to(DEV), zps.to(DEV), 0, torch.qint8)
    same(qd, q)
    torch.testing.assert_close(qd.q_per_channel_scales().cpu(), q.q_per_channel_scales())
    qt = torch.quantize_per_tensor(x.to(DEV), torch.tensor(0.05, device=DEV), torch.tensor(3, device=DEV),
                                   torch.quint8)
    same(qt, torch.quantize_per_tensor(x, torch.tensor(0.05), torch.tensor(3), torch.quint8))


def test_views_share_the_device_storage():
    q = torch._empty_affine_quantized([5, 5, 5, 5], scale=2, zero_point=3, dtype=torch.quint8, device=DEV)
    assert q.device.type == "neuron" and q.q_scale() == 2 and q.q_zero_point() == 3
    for view in (q.flatten(), q.ravel(), q.view(25, 25), q[1], q.transpose(0, 1), q.reshape(125, 5)):
        assert view.device.type == "neuron" and view.is_quantized
        assert view.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
    empty = torch._empty_affine_quantized([0, 2, 3], scale=2, zero_point=3, dtype=torch.quint8, device=DEV)
    assert empty.ravel().shape == (0,)


@pytest.mark.parametrize("dtype", QDTYPES)
def test_ops_with_quantized_kernels_equal_cpu(dtype):
    x = sample((4, 6, 5))
    q = torch.quantize_per_tensor(x, 0.1, 5, dtype)
    qd = q.to(DEV)
    for f in (lambda t: t.flip(0, 2), lambda t: torch.topk(t.flatten(), 3).values, lambda t: t.max(1).values,
              lambda t: t.sort(-1).values, lambda t: torch.cat([t, t], 1), lambda t: t.contiguous(),
              lambda t: t.transpose(0, 2).contiguous(), lambda t: t.clone(), lambda t: t.squeeze().unsqueeze(0)):
        same(f(qd), f(q))
    scalar = torch.quantize_per_tensor(torch.randn(()), 0.1, 10, torch.qint8)
    v, i = torch.topk(scalar.to(DEV), 1)
    same(v, torch.topk(scalar, 1)[0])
    assert i.device.type == "neuron" and i.item() == 0


def test_in_place_writes_reach_device_memory_and_queue_order_holds():
    x = sample((3, 4))
    qd = torch.quantize_per_tensor(x.to(DEV), 0.25, 2, torch.quint8)
    src = torch.quantize_per_tensor(torch.zeros(3, 4), 0.25, 2, torch.quint8)
    # Work queued before the quantized op must land first; the copy writes the device buffer.
    y = x.to(DEV) * 2
    qd.copy_(src.to(DEV))
    same(qd, src)
    torch.testing.assert_close(y.cpu(), x * 2)
    qd.fill_(1.0)  # quantized fill (host kernel on the device bytes)
    torch.testing.assert_close(qd.dequantize().cpu(), torch.ones(3, 4))
    assert torch_neuronx.metrics()["ops"]["aten::fill_.Scalar"]["sync"] >= 1
