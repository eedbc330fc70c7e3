"""Max-pooling before ReLU: ``max_pool(relu(y))`` becomes ``relu(max_pool(y))``.

ReLU is monotonic, so the window maxima are the same numbers either way, and ReLU then runs on
the pooled tensor (a quarter of the elements for 2x2 pooling) instead of the full feature map. In
a training graph ReLU's backward moves with it: the gradient is masked on the pooled values
before it is spread back to the windows, so the full-size ReLU output is neither written, nor
saved for the backward, nor read again by ``threshold_backward``.

The gradients are the same: where a window's maximum is positive both forms pick the same element
(the first of equal maxima; ReLU keeps positive values and NaN as they are); where it is not, the
ReLU form spreads a gradient that ``threshold_backward`` then zeroes, and the pooled form zeroes
it before spreading. Only the window's chosen indices differ then, so the rewrite applies only
where nothing but the pooling backward reads them.

Runs on the joint forward/backward graph before AOTAutograd partitions it (so the partitioner
saves the pooled values instead of the ReLU output) and on inference graphs.
"""
import operator

import torch

aten = torch.ops.aten


def _only_users(node, allowed):
    return all(u in allowed for u in node.users)


def _getitems(node):
    """{index: getitem node} of a multi-output node; None if anything else reads it."""
    items = {}
    for u in node.users:
        if u.op != "call_function" or u.target is not operator.getitem:
            return None
        items[u.args[1]] = u
    return items


def _aliases(node):
    """``node`` and the ``aten.alias`` nodes of it, transitively (AOTAutograd saves ReLU's output
    for its backward through an alias)."""
    out, todo = [node], [node]
    while todo:
        for u in todo.pop().users:
            if u.op == "call_function" and u.target is aten.alias.default:
                out.append(u)
                todo.append(u)
    return out


def _same_geometry(a, b):
    va, vb = a.meta.get("val"), b.meta.get("val")
    return (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.dtype == vb.dtype
            and va.shape == vb.shape and va.stride() == vb.stride())


def _shape_donor(y):
    """A tensor the pooling backward can take as its ``self`` in place of ``y``: it reads only
    that argument's sizes and layout, and ``y`` itself would be saved for the backward just for
    them. An operand of y's producer with y's geometry (batch norm's input, which its own
    backward saves anyway), else ``y``."""
    producer = y
    if y.op == "call_function" and y.target is operator.getitem:
        producer = y.args[0]
    if producer.op == "call_function":
        for a in producer.args:
            if isinstance(a, torch.fx.Node) and a is not y and _same_geometry(a, y):
                return a
    return y


def _is_zero(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def swap_relu_max_pool(gm):
    """Rewrites every ``max_pool2d_with_indices(relu(y))`` of ``gm`` whose ReLU output has no
    other reader (besides the pooling's and ReLU's own backward) and whose indices feed only the
    pooling backward. Returns the number rewritten."""
    g = gm.graph
    swapped = 0
    for pool in list(g.nodes):
        if pool.op != "call_function" or pool.target is not aten.max_pool2d_with_indices.default or pool.kwargs:
            continue
        relu = pool.args[0]
        if not isinstance(relu, torch.fx.Node) or relu.target is not aten.relu.default:
            continue
        items = _getitems(pool)
        if items is None or 0 not in items:
            continue
        idx = items.get(1)
        pool_bw = [u for u in idx.users] if idx is not None else []
        if any(u.target is not aten.max_pool2d_with_indices_backward.default or len(u.args) != 8 or u.kwargs
               or u.args[7] is not idx for u in pool_bw):
            continue
        # Each pooling backward's result must be ReLU's backward, and nothing else may read it.
        relus = _aliases(relu)
        relu_bw = []
        ok = True
        for pb in pool_bw:
            users = list(pb.users)
            if (pb.args[1] not in relus or len(users) != 1 or users[0].target is not aten.threshold_backward.default
                    or users[0].args[0] is not pb or users[0].args[1] not in relus or not _is_zero(users[0].args[2])):
                ok = False
                break
            relu_bw.append(users[0])
        if not ok or not all(_only_users(r, {pool, *pool_bw, *relu_bw, *relus}) for r in relus):
            continue
        y = relu.args[0]
        donor = _shape_donor(y) if pool_bw else y
        pool_args = pool.args[1:]
        with g.inserting_after(pool):
            new_pool = g.call_function(aten.max_pool2d_with_indices.default, (y, *pool_args))
        with g.inserting_after(new_pool):
            new_vals = g.call_function(operator.getitem, (new_pool, 0))
        with g.inserting_after(new_vals):
            new_idx = g.call_function(operator.getitem, (new_pool, 1))
        with g.inserting_after(new_idx):
            pooled_relu = g.call_function(aten.relu.default, (new_vals,))
        _copy_meta(pool, new_pool)
        _copy_meta(items[0], new_vals)
        _copy_meta(items[0], pooled_relu)
        if idx is not None:
            _copy_meta(idx, new_idx)
        items[0].replace_all_uses_with(pooled_relu)
        for pb, tb in zip(pool_bw, relu_bw):
            grad_pooled = pb.args[0]
            with g.inserting_before(pb):
                masked = g.call_function(aten.threshold_backward.default, (grad_pooled, pooled_relu, tb.args[2]))
            with g.inserting_after(masked):
                spread = g.call_function(aten.max_pool2d_with_indices_backward.default,
                                         (masked, donor, *pb.args[2:7], new_idx))
            _copy_meta(grad_pooled, masked)
            _copy_meta(tb, spread)
            tb.replace_all_uses_with(spread)
        for n in [*relu_bw, *pool_bw, idx, items[0], pool, *reversed(relus)]:
            if n is not None and not n.users:
                g.erase_node(n)
        swapped += 1
    if swapped:
        g.lint()
        gm.recompile()
    return swapped


def _copy_meta(src, dst):
    for k in ("val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", "seq_nr"):
        if k in src.meta:
            dst.meta[k] = src.meta[k]
