"""The compiler's op table (csrc/compiler/op_table.cpp): every entry names a real op, and what
Python derives from it (the decompositions' keep-whole list) follows it."""
import torch

import torch_neuronx  # noqa: F401
from torch_neuronx import _C
from torch_neuronx.compile import backend

SCALAR_OPS_FROM_SIZES = {"sym_size", "sym_stride", "sym_numel"}


def entries():
    return _C._compiler._op_table()


def test_every_aten_entry_names_a_registered_operator():
    table = entries()
    assert len(table) > 80
    targets = [e["target"] for e in table]
    assert len(set(targets)) == len(targets)
    for e in table:
        t = e["target"]
        if "::" not in t:
            assert e["scalar"] or t in SCALAR_OPS_FROM_SIZES, t
            continue
        namespace, _, rest = t.partition("::")
        assert namespace in ("aten", "neuronx"), t
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, namespace), name)  # raises if the op does not exist
        assert (overload or "default") in packet.overloads(), t


def test_kinds_are_consistent():
    by_target = {e["target"]: e for e in entries()}
    # An epilogue's activation is a lowered pointwise op; reductions and losses are kept whole.
    for e in by_target.values():
        if e["post_op"]:
            assert e["pointwise"], e
        if e["reduction"] or e["loss"]:
            assert e["keep_whole"], e
    assert by_target["aten::relu"]["post_op"] == "relu" and by_target["aten::silu"]["post_op"] == "swish"
    assert by_target["aten::_log_softmax"]["reduction"] == "log_softmax"
    assert by_target["aten::nll_loss_forward"]["loss"]
    assert by_target["aten::addmm"]["gemm"] == "addmm" and by_target["aten::convolution"]["gemm"] == "convolution"
    assert by_target["aten::_unsafe_view"]["reshape_view"] and by_target["aten::view"]["reshape_view"]
    assert by_target["aten::histc"]["not_lowered"] == "neuron_kernel_for_integral_input"
    assert by_target["aten::add.Tensor"]["pointwise"] and not by_target["aten::add.Tensor"]["keep_whole"]
    # Scalar programs (FlexAttention's mods): every pointwise lowering, plus comparisons, logic,
    # selection, casts, buffer reads and constants that fused loops do not take.
    for e in by_target.values():
        if e["pointwise"] and e["target"] != "aten::gelu":
            assert e["program_form"] == "arithmetic", e
    assert by_target["aten::ge.Tensor"]["program_form"] == "compare" and not by_target["aten::ge.Tensor"]["pointwise"]
    assert by_target["aten::index.Tensor"]["program_form"] == "gather"
    assert by_target["aten::where.self"]["program_form"] == "select"
    assert by_target["aten::full"]["program_form"] == "fill"
    assert by_target["neuronx::flex_attention"]["flex_attention"] and by_target["neuronx::flex_attention_backward"]["flex_attention"]


def test_decompositions_leave_the_keep_whole_ops_whole():
    keep = backend.keep_whole()
    assert torch.ops.aten.native_layer_norm in keep and torch.ops.aten.gelu in keep
    assert torch.ops.aten.add not in keep
    table = backend.decompositions()
    for packet in keep:
        for overload in packet.overloads():
            assert getattr(packet, overload) not in table, f"{packet}.{overload} is decomposed"
    # Every other core ATen decomposition stays (aten's own: other namespaces, such as
    # quantized_decomposed, register theirs when their modules are imported, which may be after
    # the table was built).
    from torch._decomp import core_aten_decompositions

    core = core_aten_decompositions()
    kept = {getattr(p, o) for p in keep for o in p.overloads()}
    assert any(op in core for op in kept), "the keep-whole list removes nothing from core ATen's decompositions"
    for op in core:
        if op not in kept and op.namespace == "aten":
            assert op in table, f"{op} lost its decomposition"
