"""FX graph → the compiler's graph description, built once per compile and handed to C++.

Values get integer ids. Tensor values carry dtype, sizes and strides (symbolic ones as small
postfix programs over the graph's symbols); symbols are bound at launch from input sizes or
scalar inputs. Scalar arithmetic Dynamo leaves on symbolic sizes and floats becomes scalar ops
the executable evaluates on the host."""
import functools
import math
import operator

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import is_concrete_int

aten = torch.ops.aten


class Unsupported(Exception):
    """The graph has something the compiler cannot take (the graph then runs eagerly)."""


class Subgraph:
    """A get_attr of a GraphModule: a higher-order op's subgraph (FlexAttention's score_mod and
    mask_mod), read only by the op that takes it."""

    __slots__ = ("gm",)

    def __init__(self, gm):
        self.gm = gm


class Ref:
    """A reference to a value (C++ reads ``_nx_ref``)."""

    __slots__ = ("_nx_ref",)

    def __init__(self, i):
        self._nx_ref = i


SCALAR_OPS = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "truediv",
    operator.floordiv: "floordiv", operator.mod: "mod", operator.neg: "neg", operator.pow: "pow",
    operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.le: "le", operator.gt: "gt",
    operator.ge: "ge", torch.sym_float: "sym_float", torch.sym_int: "sym_int", torch.sym_max: "sym_max",
    torch.sym_min: "sym_min", math.floor: "floor", math.ceil: "ceil", math.trunc: "trunc", math.sqrt: "sqrt",
    torch._sym_sqrt: "sqrt", torch.sym_sum: "sym_sum",
}
SIZE_OPS = {aten.sym_size.int: "sym_size", aten.sym_stride.int: "sym_stride", aten.sym_numel.default: "sym_numel"}


def expr_tokens(e):
    """A sympy size expression as postfix tokens."""
    if isinstance(e, (int, bool)):
        return [f"i:{int(e)}"]
    if isinstance(e, float):
        return [f"f:{e!r}"]
    if isinstance(e, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        e = e.node.expr
    if isinstance(e, sympy.Integer):
        return [f"i:{int(e)}"]
    if isinstance(e, (sympy.Float, sympy.Rational)):
        return [f"f:{float(e)!r}"]
    if isinstance(e, sympy.Symbol):
        return [f"s:{e.name}"]
    name = type(e).__name__
    ops = {"Add": "+", "Mul": "*", "FloorDiv": "//", "Mod": "%", "PythonMod": "%", "Max": "max", "Min": "min",
           "Pow": "pow", "IntTrueDiv": "/", "FloatTrueDiv": "/", "CleanDiv": "//"}
    if name in ops:
        args = e.args
        out = expr_tokens(args[0])
        for a in args[1:]:
            out += expr_tokens(a) + [ops[name]]
        return out
    raise Unsupported(f"size expression {e} ({name})")


def _size(v):
    return int(v) if is_concrete_int(v) else v


class Exporter:
    def __init__(self, gm):
        self.gm = gm
        self.values, self.inputs, self.symbols, self.nodes, self.outputs = [], [], [], [], []
        self.ids = {}          # fx node -> id, or list of ids for tuple results
        self.bound = set()     # symbol names with a source
        self.extra_inputs = []  # get_attr tensors passed as inputs

    def value(self, name, val):
        if isinstance(val, torch.Tensor):
            meta = (val.dtype, [expr_tokens(_size(s)) for s in val.shape], [expr_tokens(_size(s)) for s in val.stride()])
            self.values.append((name, "tensor", meta))
        elif isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            self.values.append((name, "scalar", None))
        else:
            self.values.append((name, "other", None))
        return len(self.values) - 1

    def bind_input(self, index, val):
        if isinstance(val, torch.Tensor):
            for d, s in enumerate(val.shape):
                if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol) and s.node.expr.name not in self.bound:
                    self.bound.add(s.node.expr.name)
                    self.symbols.append((s.node.expr.name, index, d))
        elif isinstance(val, (torch.SymInt, torch.SymFloat)) and isinstance(val.node.expr, sympy.Symbol):
            if val.node.expr.name not in self.bound:
                self.bound.add(val.node.expr.name)
                self.symbols.append((val.node.expr.name, index, -1))

    def arg(self, a):
        if isinstance(a, torch.fx.Node):
            i = self.ids[a]
            if isinstance(i, Subgraph):
                raise Unsupported(f"the subgraph {a.name} used outside a higher-order op the compiler lowers")
            if isinstance(i, list):
                raise Unsupported(f"a tuple value ({a.name}) used as an operand")
            return Ref(i)
        if isinstance(a, (list, tuple)):
            return [self.arg(x) for x in a]
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise Unsupported(f"a symbolic constant {a} not produced by a graph node")
        return a

    def run(self):
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for idx, n in enumerate(placeholders):
            val = n.meta.get("val")
            i = self.value(n.name, val)
            self.ids[n] = i
            self.inputs.append((i, isinstance(val, torch.Tensor)))
            self.bind_input(idx, val)
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "get_attr":
                t = getattr(self.gm, n.target)
                if isinstance(t, torch.fx.GraphModule):
                    self.ids[n] = Subgraph(t)
                    continue
                if not isinstance(t, torch.Tensor):
                    raise Unsupported(f"attribute {n.target} of type {type(t).__name__}")
                i = self.value(n.name, t)
                self.ids[n] = i
                self.inputs.append((i, True))
                self.extra_inputs.append(t)
            elif n.op == "call_function":
                self.call(n)
            elif n.op == "output":
                outs = n.args[0] if isinstance(n.args[0], (list, tuple)) else [n.args[0]]
                for o in outs:
                    if o is None:
                        self.outputs.append(-1)
                    elif isinstance(o, torch.fx.Node) and not isinstance(self.ids[o], list):
                        self.outputs.append(self.ids[o])
                    else:
                        raise Unsupported(f"graph output {o!r}")
            else:
                raise Unsupported(f"node kind {n.op}")
        return {"values": self.values, "inputs": self.inputs, "symbols": self.symbols, "nodes": self.nodes,
                "outputs": self.outputs}

    def call(self, n):
        t = n.target
        val = n.meta.get("val")
        if t is operator.getitem and isinstance(self.ids.get(n.args[0]), list):
            self.ids[n] = self.ids[n.args[0]][n.args[1]]
            return
        if t in SIZE_OPS or t in SCALAR_OPS:
            i = self.value(n.name, val)
            self.ids[n] = i
            args = n.args[0] if t is torch.sym_sum else n.args  # sym_sum takes its terms as one list
            self.nodes.append(("scalar", SIZE_OPS.get(t) or SCALAR_OPS[t], [self.arg(a) for a in args], {}, [i]))
            return
        if t is torch.ops.higher_order.with_effects:
            return self.effectful_call(n)
        if t is torch.ops.higher_order.out_dtype:
            return self.out_dtype_call(n)
        if t is torch.ops.higher_order.flex_attention:
            return self.flex_call(n, backward=False)
        if t is torch.ops.higher_order.flex_attention_backward:
            return self.flex_call(n, backward=True)
        if not isinstance(t, torch._ops.OpOverload):
            raise Unsupported(f"call of {getattr(t, '__name__', t)}")
        schema = t._schema
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        if isinstance(val, (list, tuple)):
            outs = [self.value(f"{n.name}_{k}", v) for k, v in enumerate(val)]
            self.ids[n] = outs
        else:
            outs = [self.value(n.name, val)]
            self.ids[n] = outs[0]
        args = [self.arg(a) for a in n.args]
        kwargs = {k: self.arg(v) for k, v in n.kwargs.items()}
        self.nodes.append(("aten", name, args, kwargs, outs))

    def effectful_call(self, n):
        # AOTAutograd threads an op with side effects (linalg's _linalg_check_errors) through an
        # effect token: with_effects(token, op, *args) -> (token, *results). Graph order already
        # orders the effects, so the op becomes an ordinary node and the token passes through.
        token, op, *rest = n.args
        if not isinstance(op, torch._ops.OpOverload) or isinstance(self.ids.get(token), list):
            raise Unsupported(f"with_effects of {op}")
        val = n.meta.get("val")
        results = list(val[1:]) if isinstance(val, (list, tuple)) else []
        outs = [self.value(f"{n.name}_{k + 1}", v) for k, v in enumerate(results) if v is not None]
        self.ids[n] = [self.ids[token], *outs]
        schema = op._schema
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        self.nodes.append(("aten", name, [self.arg(a) for a in rest], {k: self.arg(v) for k, v in n.kwargs.items()},
                           outs))


    def out_dtype_call(self, n):
        # out_dtype(op, dtype, *args) (TorchAO's int8 matmuls), as eager runs it on neuron
        # (torch_neuronx._torch_compat): int8 x int8 -> int32 matmuls are _int_mm; anything else
        # is the operands cast to the promoted dtype, the op, and a cast to `dtype`.
        from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

        from .._torch_compat import is_int8_mm

        op, out_dtype, *args = n.args
        if not isinstance(op, torch._ops.OpOverload) or any(isinstance(a, (list, tuple)) for a in args):
            raise Unsupported(f"out_dtype of {op}")
        vals = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
        out = self.value(n.name, n.meta.get("val"))
        if is_int8_mm(op, out_dtype, vals):
            self.ids[n] = out
            self.nodes.append(("aten", "aten::_int_mm", [self.arg(a) for a in args], {}, [out]))
            return
        tensors = [v for v in vals if isinstance(v, torch.Tensor)]
        promote = elementwise_dtypes(*tensors, torch.ones(1, dtype=out_dtype),
                                     type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[0]
        refs = []
        for k, (a, v) in enumerate(zip(args, vals)):
            if isinstance(v, torch.Tensor) and v.dtype != promote:
                vals[k] = v.to(promote)
                i = self.value(f"{n.name}_arg{k}", vals[k])
                self.nodes.append(("aten", "aten::_to_copy", [self.arg(a)], {"dtype": promote}, [i]))
                refs.append(Ref(i))
            else:
                refs.append(self.arg(a))
        schema = op._schema
        name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        result = op(*vals)
        r = out if result.dtype == out_dtype else self.value(f"{n.name}_op", result)
        self.nodes.append(("aten", name, refs, {}, [r]))
        if r != out:
            self.nodes.append(("aten", "aten::_to_copy", [Ref(r)], {"dtype": out_dtype}, [out]))
        self.ids[n] = out


    def subgraph(self, node):
        i = self.ids.get(node) if isinstance(node, torch.fx.Node) else None
        if not isinstance(i, Subgraph):
            raise Unsupported(f"a FlexAttention mod that is not a traced subgraph ({node!r})")
        return i.gm

    def flex_call(self, n, backward):
        # flex_attention(q, k, v, score_mod, block_mask, scale, kernel_options, score_bufs, mask_bufs) and
        # flex_attention_backward(q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, ...)
        # become neuronx::flex_attention(_backward) (csrc/compiler/flex_attention.h), whose program
        # argument carries the mods as scalar programs.
        if backward:
            q, k, v, out, lse, grad_out, grad_lse, score_mod, joint, block_mask, scale, _options, sbufs, mbufs = n.args
        else:
            q, k, v, score_mod, block_mask, scale, _options, sbufs, mbufs = n.args
        dtype = q.meta["val"].dtype
        if dtype not in (torch.float32, torch.bfloat16, torch.float16) or any(
                x.meta["val"].dtype != dtype for x in (k, v)):
            raise Unsupported(f"flex_attention on {dtype} inputs")
        kv_num, kv_idx, full_num, full_idx = block_mask[2:6]
        q_block, kv_block, mask_mod = block_mask[-3:]
        if not all(isinstance(x, int) for x in (q_block, kv_block)) or not isinstance(scale, (int, float)):
            raise Unsupported("flex_attention with symbolic block sizes or scale")
        lines = [f"flex {_PROGRAM_DTYPES[dtype]} {int(backward)}", *scalar_program(self.subgraph(score_mod)),
                 *scalar_program(self.subgraph(mask_mod))]
        vals = n.meta["val"]
        if backward:
            if grad_out is None:
                raise Unsupported("flex_attention_backward without grad_out")
            lines += scalar_program(self.subgraph(joint), joint=True)
        for u in n.users:  # the backward's fourth result: gradients of captured tensors
            if u.target is not operator.getitem or u.args[1] > 2:
                raise Unsupported("flex_attention whose score_mod's captured tensors need gradients")
        outs = [self.value(f"{n.name}_{i}", vals[i]) for i in range(3)]
        self.ids[n] = outs
        tensors = [q, k, v, out, lse, grad_out, grad_lse] if backward else [q, k, v]
        args = [self.arg(x) for x in tensors] + [self.arg(x) for x in (kv_num, kv_idx, full_num, full_idx)]
        args += [self.arg(list(sbufs)), self.arg(list(mbufs)), float(scale), q_block, kv_block, "\n".join(lines)]
        target = "neuronx::flex_attention_backward" if backward else "neuronx::flex_attention"
        self.nodes.append(("aten", target, args, {}, outs))


_PROGRAM_DTYPES = {
    torch.float32: "Float", torch.float64: "Double", torch.bfloat16: "BFloat16", torch.float16: "Half",
    torch.int32: "Int", torch.int64: "Long", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
    torch.bool: "Bool",
}


@functools.lru_cache(None)
def _program_ops():
    """The op-table targets a scalar program may use (those with a program form)."""
    from .. import _C

    return frozenset(e["target"] for e in _C._compiler._op_table() if e["program_form"])


def scalar_program(gm, joint=False):
    """A FlexAttention mod (score_mod, mask_mod, or the score_mod's joint gradient graph) as the
    text lines csrc/compiler/scalar_program.cpp parses: its inputs (0-d values, then captured
    tensors), one step per op over 0-d values, its outputs. Anything else raises Unsupported."""
    ids, inputs, steps, outs = {}, [], [], []

    def dtype_of(val):
        if not isinstance(val, torch.Tensor) or val.dtype not in _PROGRAM_DTYPES:
            raise Unsupported(f"a FlexAttention mod value {val!r}")
        return _PROGRAM_DTYPES[val.dtype]

    def tokens(a):
        if isinstance(a, torch.fx.Node):
            return [f"v{ids[a]}"]
        if isinstance(a, bool):
            return [f"b{int(a)}"]
        if isinstance(a, int):
            return [f"i{a}"]
        if isinstance(a, float):
            return [f"f{a!r}"]
        if a is None:
            return ["n"]
        if isinstance(a, (list, tuple)):
            return ["[", *[t for x in a for t in tokens(x)], "]"]
        return ["o"]  # a dtype, device, layout, string: no lowering reads it

    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            ids[node] = len(ids)
            inputs.append(f"in {dtype_of(val)} {val.dim()}")
        elif node.op == "call_function":
            if not isinstance(node.target, torch._ops.OpOverload):
                raise Unsupported(f"{getattr(node.target, '__name__', node.target)} inside a FlexAttention mod")
            if isinstance(val, torch.Tensor) and val.dim() != 0:
                raise Unsupported(f"a FlexAttention mod computing a tensor of shape {tuple(val.shape)}")
            schema = node.target._schema
            name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
            if name not in _program_ops():
                raise Unsupported(f"{name} inside a FlexAttention score_mod or mask_mod (no lowering)")
            toks = [t for a in node.args for t in tokens(a)]
            if node.kwargs:
                toks += ["|"] + [t for kname, kv in node.kwargs.items() for t in (kname, *tokens(kv))]
            ids[node] = len(ids)
            steps.append(" ".join(["step", dtype_of(val), name, *toks]))
        elif node.op == "output":
            res = node.args[0]
            res = list(res) if isinstance(res, (list, tuple)) else [res]
            if joint and any(r is not None for r in res[5:]):
                raise Unsupported("flex_attention whose score_mod's captured tensors need gradients")
            outs = [f"out v{ids[r]}" if isinstance(r, torch.fx.Node) else "out n" for r in res[:1]]
        else:
            raise Unsupported(f"{node.op} {node.target} inside a FlexAttention mod")
    return [f"program {len(inputs)} {len(steps)} {len(outs)}", *inputs, *steps, *outs]


def export(gm):
    """(description, extra_inputs): the graph for ``_C._compiler.compile`` and the constant tensors
    appended to the inputs at every call."""
    e = Exporter(gm)
    return e.run(), e.extra_inputs
