"""TorchAO on neuron, the library unchanged (issue 28 §3): ``quantize_`` with int8 weight-only and
int8 dynamic-activation configs, and ``convert_to_float8_training`` (tensorwise and rowwise
recipes), on a tiny Llama built from a config, eager and compiled, against the same on CPU."""
import copy

import pytest
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx.compile import compile_metrics, reset_compile_metrics

import torchao  # noqa: E402  (make installs the pinned version: pyproject's [ao] extra)
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.quantization import (Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig,  # noqa: E402
                                  quantize_)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

QUANT_CONFIGS = {"int8_weight_only": Int8WeightOnlyConfig, "int8_dynamic_activation": Int8DynamicActivationInt8WeightConfig}


def test_pinned_version():
    assert torchao.__version__ == "0.18.0"


def _device_ops():
    """How many times each ATen op has run on the device so far."""
    return {op: sum(paths.values()) for op, paths in torch_neuronx.metrics()["ops"].items()}


def _ran(before, op):
    return _device_ops().get(op, 0) - before.get(op, 0)


def _llama(layers):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256)
    return LlamaForCausalLM(cfg)


@pytest.fixture(scope="module")
def llama8():
    # 8 layers, 57 linear layers, 6.8M parameters in 75 tensors.
    return _llama(8).eval()


def _ids(batch=4, seq=128):
    return torch.randint(0, 1024, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", sorted(QUANT_CONFIGS))
def test_quantize_inference_equals_cpu(llama8, name):
    ids = _ids()
    cpu = copy.deepcopy(llama8)
    quantize_(cpu, QUANT_CONFIGS[name]())
    dev = copy.deepcopy(llama8).to("neuron")
    quantize_(dev, QUANT_CONFIGS[name]())  # quantized where the weights are, on the device
    w = dev.model.layers[0].mlp.up_proj.weight
    assert type(w).__name__ == "Int8Tensor" and w.device.type == "neuron" and w.qdata.dtype == torch.int8
    with torch.no_grad():
        expected = cpu(ids).logits
        before = _device_ops()
        got = dev(ids.to("neuron")).logits
    # The quantized matmuls ran on the device, one per linear layer (8 x 7 and the output
    # projection): int8 x int8 -> int32 (_int_mm, as on CUDA) after the activations were quantized,
    # or on the int8 weights cast to the activations' dtype.
    linears = 8 * 7 + 1
    if name == "int8_dynamic_activation":
        assert _ran(before, "aten::round") == linears and _ran(before, "aten::_int_mm") == linears
    else:
        assert _ran(before, "aten::mm") + _ran(before, "aten::addmm") + _ran(before, "aten::linear") >= linears
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("name", sorted(QUANT_CONFIGS))
def test_quantize_compiled_equals_cpu_and_runs_compiled(name):
    model = _llama(1).eval()
    ids = _ids(2, 64)
    cpu = copy.deepcopy(model)
    quantize_(cpu, QUANT_CONFIGS[name]())
    dev = copy.deepcopy(model).to("neuron")
    quantize_(dev, QUANT_CONFIGS[name]())
    torch._dynamo.reset()
    reset_compile_metrics()
    with torch.no_grad():
        got = torch.compile(dev, backend="neuron")(ids.to("neuron")).logits.cpu()
        expected = cpu(ids).logits
    m = compile_metrics()
    # The int8 x int8 matmul is the out_dtype higher-order op in the graph; it must not send the
    # graph back to eager.
    assert m["compiles"] >= 1 and m["eager_graphs"] == 0, m["eager_reasons"]
    if name == "int8_weight_only":
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        # Per-token activation quantization turns the compiled kernels' last-bit differences
        # (~6e-7 in these logits without quantization) into an occasional int8 step: a few
        # quanta at most, and rare.
        err = (got - expected).abs()
        assert err.max() < 0.05 and err.mean() < 1e-3, (err.max(), err.mean())
    torch._dynamo.reset()


@pytest.fixture
def scaled_mm_without_onednn():
    """On hosts with AMX, CPU's _scaled_mm runs oneDNN's float8 matmul, which on these hosts is its
    reference implementation: ~800x slower than the dequantizing path other hosts take (a
    256x256 product: 570 ms against 0.7 ms), with the same values. The neuron device runs CPU's
    kernel, so the CPU and the neuron runs both take the dequantizing path."""
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def _float8_train(model, dev, recipe, steps, compiled=False):
    m = copy.deepcopy(model).to(dev, torch.bfloat16).train()
    # As TorchTitan does: the output projection stays in high precision.
    convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda mod, fqn: "lm_head" not in fqn)
    assert type(m.model.layers[0].self_attn.q_proj).__name__ == "Float8Linear"
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    run = torch.compile(m, backend="neuron") if compiled else m
    ids = _ids().to(dev)
    losses = []
    for _ in range(steps):
        loss = run(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in m.parameters()]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_training_equals_cpu(llama8, recipe, scaled_mm_without_onednn):
    cpu_losses, cpu_params = _float8_train(llama8, "cpu", recipe, steps=3)
    before = _device_ops()
    losses, params = _float8_train(llama8, "neuron", recipe, steps=3)
    # The float8 GEMMs ran on the device: 3 per linear layer per step (output, input and weight
    # gradients), fewer where a recipe keeps the weight gradient in high precision.
    assert _ran(before, "aten::_scaled_mm") >= 3 * 8 * 7 * 2
    assert losses == cpu_losses
    assert all(torch.equal(a, b) for a, b in zip(params, cpu_params))
    assert losses[-1] < losses[0]


def test_float8_training_compiled_matches_eager(scaled_mm_without_onednn):
    model = _llama(2)
    torch._dynamo.reset()
    reset_compile_metrics()
    losses, params = _float8_train(model, "neuron", "tensorwise", steps=2, compiled=True)
    m = compile_metrics()
    assert m["compiles"] >= 2 and m["eager_graphs"] == 0, m["eager_reasons"]  # forward and backward
    torch._dynamo.reset()
    cpu_losses, cpu_params = _float8_train(model, "cpu", "tensorwise", steps=2)
    # Compiled kernels round bf16 intermediates differently from eager's per-op kernels.
    assert losses == pytest.approx(cpu_losses, rel=2e-3)
    for a, b in zip(params, cpu_params):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=1e-2)


def test_out_dtype_int8_mm_is_int_mm_eager_and_compiled():
    # TorchAO's int8 matmul is out_dtype(mm, int32, int8, int8); neuron runs it as _int_mm (as
    # CUDA does), and the compiler lowers the higher-order op instead of sending the graph to eager.
    from torch._higher_order_ops.out_dtype import out_dtype

    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (33, 200), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (200, 17), dtype=torch.int8, generator=g)
    x = torch.randn(33, 200, generator=g).to(torch.bfloat16)
    w = torch.randn(200, 17, generator=g).to(torch.bfloat16)

    def f(a, b, x, w):
        return out_dtype(torch.ops.aten.mm.default, torch.int32, a, b), \
            out_dtype(torch.ops.aten.mm.default, torch.float32, x, w)

    expected = f(a, b, x, w)  # CPU: int32 GEMM, and bf16 promoted to float32 before the GEMM
    assert torch.equal(expected[0], a.int() @ b.int())
    dev = [t.to("neuron") for t in (a, b, x, w)]
    before = _device_ops()
    got = f(*dev)
    assert _ran(before, "aten::_int_mm") == 1
    torch._dynamo.reset()
    reset_compile_metrics()
    compiled = torch.compile(f, backend="neuron", fullgraph=True)(*dev)
    m = compile_metrics()
    assert m["eager_graphs"] == 0, m["eager_reasons"]
    assert m["library_calls"].get("aten::_int_mm") == 1, m["library_calls"]
    for out in (got, compiled):
        assert out[0].dtype == torch.int32 and torch.equal(out[0].cpu(), expected[0])
        assert out[1].dtype == torch.float32 and torch.equal(out[1].cpu(), expected[1])
    torch._dynamo.reset()
