"""Channels-last layout for convolution graphs.

The device's convolutions are oneDNN's: given an NCHW input they reorder it to a blocked layout and
the result back on every call, and the batch norm, ReLU and max-pool kernels around them take their
slow NCHW paths. Given a channels-last (NHWC) input, the convolution works in place and returns
channels-last, and the kernels around it take their vectorized channels-last paths: a CNN training
step runs ~1.5x faster. So, as Inductor does for CPU, a graph with 2-d convolutions is rewritten to
give each convolution (and convolution backward) channels-last operands; the layout then flows
through the ops that follow. Values the user or autograd sees keep the strides they were traced
with; activations a forward saves for its backward stay channels-last, and the backward is told.

The rewritten graph's metas are recomputed by running each affected node again under the fake
mode. The fake convolution for a non-CPU device always answers NCHW; on this device it returns what
oneDNN does (channels-last when its input is), which is the rule applied here."""
import contextlib
import contextvars
import operator

import torch

aten = torch.ops.aten
CL = torch.channels_last
_CONVS = {aten.convolution.default: (0,), aten.convolution_backward.default: (0, 1)}

# Layouts of the activations a forward saves for its backward, by the value's name (the partitioner
# names a saved value the same in both graphs). Set for one backend call: the backward is compiled
# right after its forward (force_non_lazy_backward_lowering).
_SAVED = contextvars.ContextVar("torch_neuronx_saved_layouts", default=None)


@contextlib.contextmanager
def saved_layouts():
    """Scope of one AOTAutograd compile: forward and backward share the saved values' layouts."""
    token = _SAVED.set({})
    try:
        yield
    finally:
        _SAVED.reset(token)


def _is_cl(v):
    return isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_contiguous(memory_format=CL)


def _static(v):
    return all(isinstance(s, int) for s in (*v.shape, *v.stride()))


def _convertible(v):
    return (isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point() and _static(v)
            and v.numel() > 0)


def _same_layout(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.stride() == b.stride() and a.shape == b.shape
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return all(_same_layout(x, y) for x, y in zip(a, b))
    return a is b or not isinstance(a, (torch.Tensor, list, tuple))


def _keeps_traced_layout(node):
    """Ops that must see their inputs as traced: they read strides themselves (as_strided), draw
    random numbers in memory order (eager's draws must land on the same elements), or are not
    ATen's (a custom kernel may assume the layout it was traced with)."""
    t = node.target
    if not isinstance(t, torch._ops.OpOverload):
        return False
    if t.namespace != "aten" or t._schema.name.startswith("aten::as_strided"):
        return True
    fixed = {torch.Tag.nondeterministic_seeded, torch.Tag.needs_fixed_stride_order}
    exact = getattr(torch.Tag, "needs_exact_strides", None)
    if exact is not None:
        fixed.add(exact)
    return any(tag in fixed for tag in t.tags)


def _user_output_count(kind, n_outputs):
    if kind != "forward":
        return n_outputs
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None or getattr(meta, "tokens", None):
        return None
    return meta.num_forward


def channels_last(gm, kind):
    """Rewrite ``gm`` in place for channels-last convolutions (see the module docstring). Returns
    (convolutions now reading channels-last inputs, saved activations a forward sends
    channels-last, those a backward receives); (0, 0, 0) when the graph is unchanged."""
    saved = _SAVED.get()
    nodes = list(gm.graph.nodes)
    incoming = {n: saved[n.name] for n in nodes
                if n.op == "placeholder" and saved and n.name in saved and isinstance(n.meta.get("val"), torch.Tensor)
                and n.meta["val"].shape == saved[n.name].shape and n.meta["val"].dtype == saved[n.name].dtype
                and not _same_layout(saved[n.name], n.meta["val"])}
    done = _rewrite(gm, kind, nodes, incoming, saved)
    if done is None:
        if not incoming:
            return 0, 0, 0
        _convert_incoming(gm, nodes, incoming)
        return 0, 0, len(incoming)
    return done


def _after(g, nodes, node):
    """Where a node reading ``node`` goes: right after it (placeholders: before the first op)."""
    if node.op != "placeholder":
        return g.inserting_after(node)
    return g.inserting_before(next(n for n in nodes if n.op != "placeholder"))


def _convert_incoming(gm, nodes, incoming):
    """A backward not rewritten still receives its forward's channels-last activations: each is
    copied into the layout the backward was traced with, before anything reads it."""
    g = gm.graph
    for n, v in incoming.items():
        orig = n.meta["val"]
        with _after(g, nodes, n):
            c = g.call_function(aten.clone.default, (n,), {"memory_format": torch.contiguous_format})
        n.replace_all_uses_with(c, delete_user_cb=lambda u: u is not c)
        c.meta["val"] = orig
        n.meta["val"] = v
    g.lint()
    gm.recompile()


def _rewrite(gm, kind, nodes, incoming, saved):
    convs = [n for n in nodes if n.target in _CONVS and n.args and _convertible(n.args[0].meta.get("val"))
             and isinstance(n.args[1].meta.get("val"), torch.Tensor) and n.args[1].meta["val"].dim() == 4]
    if not convs and not incoming:
        return None
    if any(n.op == "call_function" and not isinstance(n.target, torch._ops.OpOverload)
           and n.target is not operator.getitem for n in nodes):
        return None  # higher-order ops: their subgraphs' metas are not propagated here
    out_node = nodes[-1]
    outs = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    # Without the forward/backward scope (saved_layouts), nothing would tell a backward: saved
    # values leave in their traced layout too.
    n_user = _user_output_count(kind, len(outs)) if saved is not None else len(outs)
    if n_user is None:
        return None
    fake_mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in nodes if n.op == "placeholder"])
    if fake_mode is None:
        return None

    new = {}           # node -> its value under the new layout (changed nodes only)
    clones = {}        # node -> its channels-last value, for nodes a convolution reads
    back = {}          # node -> the format its traced layout is copied back into, for...
    back_users = {}    # ...the nodes that need it (a view traced on contiguous strides, say)
    conv_set = set(convs)

    def val(a):
        if isinstance(a, torch.fx.Node):
            return new.get(a, a.meta.get("val"))
        if isinstance(a, (list, tuple)):
            return type(a)(val(x) for x in a)
        if isinstance(a, dict):
            return {k: val(x) for k, x in a.items()}
        return a

    def copy_back(n):
        """``n`` reads its changed inputs through copies in the layouts it was traced with, and
        so computes what it was traced to (its traced value)."""
        for a in n.all_input_nodes:
            if a in new:
                orig = a.meta["val"]
                fmt = torch.contiguous_format if orig.is_contiguous() else CL if _is_cl(orig) else None
                if fmt is None or back.get(a, fmt) != fmt:
                    raise ValueError(f"{a.name}: a layout no copy restores")
                back[a] = fmt
                back_users.setdefault(n, []).append(a)
        return n.meta.get("val")

    try:
        with fake_mode:
            for n, v in incoming.items():
                if not _same_layout(v, n.meta["val"]):
                    new[n] = torch.empty_strided(v.shape, v.stride(), dtype=n.meta["val"].dtype,
                                                 device=n.meta["val"].device)
            for n in nodes:
                if n.op != "call_function":
                    continue
                if n in conv_set:
                    for i in _CONVS[n.target]:
                        src = n.args[i]
                        v = val(src)
                        if isinstance(src, torch.fx.Node) and _convertible(v) and not _is_cl(v):
                            clones.setdefault(src, v.contiguous(memory_format=CL))
                args = val(n.args)
                if n in conv_set:
                    acts = _CONVS[n.target]
                    args = tuple(clones.get(a, val(a)) if i in acts and isinstance(a, torch.fx.Node) else val(a)
                                 for i, a in enumerate(n.args))
                elif not any(a in new for a in n.all_input_nodes):
                    continue
                if n.target is operator.getitem:
                    res = args[0][args[1]]
                elif _keeps_traced_layout(n):
                    res = copy_back(n)
                else:
                    try:
                        res = n.target(*args, **val(n.kwargs))
                    except Exception:
                        if n in conv_set:
                            raise
                        res = copy_back(n)  # (a view of a flattened feature map, say)
                if n in conv_set and _is_cl(args[0 if n.target is aten.convolution.default else 1]):
                    # oneDNN's rule: a channels-last input gives channels-last results (and, in the
                    # backward, a channels-last weight gradient).
                    res = (res.contiguous(memory_format=CL) if isinstance(res, torch.Tensor)
                           else tuple(r.contiguous(memory_format=CL) if r is not None and r.dim() == 4 else r
                                      for r in res))
                if not _same_layout(res, n.meta.get("val")):
                    new[n] = res
    except Exception:  # an op whose fake kernel cannot run again here: keep the traced layout
        return None
    if not clones and not new:
        return None

    # Values leaving the graph for the user or autograd get back the strides they were traced with.
    restore = []
    for i, o in enumerate(outs):
        if not isinstance(o, torch.fx.Node) or o not in new or not isinstance(new[o], torch.Tensor):
            continue
        orig = o.meta["val"]
        if i >= n_user:  # saved for the backward, which reads it channels-last or copies it back
            if not orig.is_contiguous():
                return None
            continue
        if orig.is_contiguous():
            restore.append((i, torch.contiguous_format))
        elif _is_cl(orig):
            restore.append((i, CL))
        else:
            return None

    g = gm.graph
    for src, v in clones.items():
        with _after(g, nodes, src):
            c = g.call_function(aten.clone.default, (src,), {"memory_format": CL})
        c.meta["val"] = v
        for user in [u for u in src.users if u in conv_set]:
            acts = _CONVS[user.target]
            user.args = tuple(c if a is src and i in acts else a for i, a in enumerate(user.args))
    copies = {}
    for a, fmt in back.items():
        with _after(g, nodes, a):
            c = g.call_function(aten.clone.default, (a,), {"memory_format": fmt})
        c.meta["val"] = a.meta["val"]
        copies[a] = c
    for n, srcs in back_users.items():
        for a in srcs:
            n.replace_input_with(a, copies[a])
    for n, v in new.items():
        n.meta["val"] = v
    for i, fmt in restore:
        o = outs[i]
        with g.inserting_before(out_node):
            c = g.call_function(aten.clone.default, (o,), {"memory_format": fmt})
        with fake_mode:
            c.meta["val"] = new[o].clone(memory_format=fmt)
        outs[i] = c
    out_node.args = (type(out_node.args[0])(outs) if isinstance(out_node.args[0], (list, tuple)) else outs[0],)
    received = sum(1 for n in incoming if n in new)
    sent = 0
    if saved is not None and kind == "forward":
        for o in outs[n_user:]:
            if isinstance(o, torch.fx.Node) and o in new and isinstance(new[o], torch.Tensor):
                saved[o.name] = new[o]
                sent += 1
    g.lint()
    gm.recompile()
    conv_input = {aten.convolution.default: 0, aten.convolution_backward.default: 1}
    return sum(1 for n in convs if _is_cl(n.args[conv_input[n.target]].meta["val"])), sent, received
