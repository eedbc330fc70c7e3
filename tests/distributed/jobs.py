"""Multi-process jobs for tests/test_distributed.py: ``python jobs.py JOB OUTDIR`` in every
rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT set by the launcher). Each job compares the
``neuron`` backend with the same work on CPU tensors (Gloo), rank by rank, raises on any
difference, and writes ``OUTDIR/JOB.rank<r>.json`` with what it checked."""
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

JOBS = {}


def job(fn):
    JOBS[fn.__name__] = fn
    return fn


def rank():
    return dist.get_rank()


def world():
    return dist.get_world_size()


def dev():
    return torch.device("neuron", int(os.environ.get("LOCAL_RANK", os.environ["RANK"])) % torch.neuron.device_count())


def close(a, b, msg, rtol=1e-5, atol=1e-6):
    a, b = a.detach().cpu(), b.detach().cpu()
    # Identical tensors are the common case, and torch.equal is fast where assert_close takes
    # a second at 64 MB.
    if a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b):
        return
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{msg}: {m}")


# ----------------------------------------------------------------------- collectives

def _value(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def _run_both(fn, *tensors):
    """Run fn on CPU copies (Gloo) and on neuron copies; return both results as CPU tensors."""
    cpu = [t.clone() for t in tensors]
    neu = [t.to(dev()) for t in tensors]
    fn(*cpu)
    fn(*neu)
    return cpu, [t.cpu() for t in neu]


DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32)


def _peer_access():
    """Whether the group's ranks reach each other's device memory directly (one host)."""
    return dist.distributed_c10d._get_default_group()._get_backend(torch.device("neuron")).peer_access


def _every_collective(dtype, size, every_op=True):
    """Every collective on `size` elements of `dtype` per rank, neuron against Gloo on CPU;
    returns how many were compared. every_op=False: the reductions with SUM and MAX only (an
    elementwise op is the same at every size; the large sizes are there for the transport)."""
    r, n = rank(), world()
    checked = 0
    RO = dist.ReduceOp
    x = _value((size,), dtype, seed=r * 100 + size)
    ops = [RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX]
    if not dtype.is_floating_point:
        ops += [RO.BAND, RO.BOR, RO.BXOR]
    if not every_op:
        ops = [RO.SUM, RO.MAX]
    gloo_ops = [op for op in ops if op in (RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX)]  # its reduce-scatter's
    tol = dict(rtol=1e-2, atol=1e-2) if dtype in (torch.bfloat16, torch.float16) else {}
    for op in ops:
        c, d = _run_both(lambda t: dist.all_reduce(t, op=op), x)
        close(d[0], c[0], f"all_reduce {op} {dtype} n={size}", **tol)
        checked += 1
    # AVG and PREMUL_SUM (not in Gloo): against SUM on CPU.
    c, _ = _run_both(lambda t: dist.all_reduce(t, op=RO.SUM), x)
    if dtype.is_floating_point:
        d = x.to(dev())
        dist.all_reduce(d, op=RO.AVG)
        close(d, (c[0].float() / n).to(dtype), f"all_reduce AVG {dtype}", **tol)
        d = x.to(dev())
        dist.all_reduce(d, op=dist._make_nccl_premul_sum(0.5))
        close(d, (c[0].float() * 0.5).to(dtype), f"all_reduce PREMUL_SUM {dtype}", **tol)
    else:
        d = x.to(dev())
        dist.all_reduce(d, op=RO.AVG)
        close(d, torch.div(c[0], n, rounding_mode="trunc"), f"all_reduce AVG {dtype}")
    checked += 2
    c, d = _run_both(lambda t: dist.broadcast(t, src=1), x)
    close(d[0], c[0], f"broadcast {dtype}")
    for op in ops:
        c, d = _run_both(lambda t: dist.reduce(t, dst=0, op=op), x)
        if r == 0:  # the other ranks' tensors are scratch space
            close(d[0], c[0], f"reduce {op} {dtype}", **tol)
        checked += 1
    if dtype.is_floating_point:
        c, _ = _run_both(lambda t: dist.reduce(t, dst=0, op=RO.SUM), x)
        d = x.to(dev())
        dist.reduce(d, dst=0, op=RO.AVG)
        if r == 0:
            close(d, (c[0].float() / n).to(dtype), f"reduce AVG {dtype}", **tol)
        checked += 1
    # all_gather (list), all_gather_into_tensor, reduce_scatter(_tensor), all_to_all(_single)
    outs_c = [torch.empty_like(x) for _ in range(n)]
    outs_d = [torch.empty_like(x, device=dev()) for _ in range(n)]
    dist.all_gather(outs_c, x)
    dist.all_gather(outs_d, x.to(dev()))
    for a, b in zip(outs_d, outs_c):
        close(a, b, f"all_gather {dtype}")
    big_c, big_d = torch.empty(n * size, dtype=dtype), torch.empty(n * size, dtype=dtype, device=dev())
    dist.all_gather_into_tensor(big_c, x)
    dist.all_gather_into_tensor(big_d, x.to(dev()))
    close(big_d, big_c, f"all_gather_into_tensor {dtype}")
    inp = _value((n * size,), dtype, seed=r + 7)
    rs_c, rs_d = torch.empty(size, dtype=dtype), torch.empty(size, dtype=dtype, device=dev())
    for op in gloo_ops:
        dist.reduce_scatter_tensor(rs_c, inp, op=op)
        dist.reduce_scatter_tensor(rs_d, inp.to(dev()), op=op)
        close(rs_d, rs_c, f"reduce_scatter_tensor {op} {dtype}", **tol)
        checked += 1
    lst = list(inp.chunk(n)) if size else [torch.empty(0, dtype=dtype) for _ in range(n)]
    for op in gloo_ops:
        dist.reduce_scatter(rs_c, lst, op=op)
        dist.reduce_scatter(rs_d, [t.to(dev()) for t in lst], op=op)
        close(rs_d, rs_c, f"reduce_scatter {op} {dtype}", **tol)
        checked += 1
    if dtype.is_floating_point:  # AVG and PREMUL_SUM: against SUM on CPU
        dist.reduce_scatter_tensor(rs_c, inp)
        dist.reduce_scatter_tensor(rs_d, inp.to(dev()), op=RO.AVG)
        close(rs_d, (rs_c.float() / n).to(dtype), f"reduce_scatter_tensor AVG {dtype}", **tol)
        dist.reduce_scatter_tensor(rs_d, inp.to(dev()), op=dist._make_nccl_premul_sum(0.25))
        close(rs_d, (rs_c.float() * 0.25).to(dtype), f"reduce_scatter_tensor PREMUL_SUM {dtype}", **tol)
        checked += 2
    # uneven all_to_all_single: rank r sends (j + 1) * k elements to rank j, k growing with size
    k = size // n + size % 5 + 1
    in_splits = [(j + 1) * k for j in range(n)]
    out_splits = [(r + 1) * k] * n
    src = _value((sum(in_splits),), dtype, seed=r + 11)
    a2a_c = torch.empty(sum(out_splits), dtype=dtype)
    a2a_d = torch.empty(sum(out_splits), dtype=dtype, device=dev())
    dist.all_to_all_single(a2a_c, src, out_splits, in_splits)
    dist.all_to_all_single(a2a_d, src.to(dev()), out_splits, in_splits)
    close(a2a_d, a2a_c, f"all_to_all_single uneven {dtype}")
    ins = [_value((size,), dtype, seed=r * 10 + j) for j in range(n)]
    o_c = [torch.empty(size, dtype=dtype) for _ in range(n)]
    o_d = [torch.empty(size, dtype=dtype, device=dev()) for _ in range(n)]
    dist.all_to_all(o_c, ins)
    dist.all_to_all(o_d, [t.to(dev()) for t in ins])
    for a, b in zip(o_d, o_c):
        close(a, b, f"all_to_all {dtype}")
    # uneven all_to_all (lists, as NCCL takes them; Gloo's need one size): rank q sends
    # size // 2 + q + 2 * j elements to rank j, against the known values
    def count(q, j):
        return size // 2 + q + 2 * j
    o_d = [torch.empty(count(q, r), dtype=dtype, device=dev()) for q in range(n)]
    dist.all_to_all(o_d, [_value((count(r, j),), dtype, seed=r * 10 + j).to(dev()) for j in range(n)])
    for q, a in enumerate(o_d):
        close(a, _value((count(q, r),), dtype, seed=q * 10 + r), f"all_to_all uneven {dtype} from rank {q}")
    # gather / scatter
    g_c = [torch.empty_like(x) for _ in range(n)] if r == 0 else None
    g_d = [torch.empty_like(x, device=dev()) for _ in range(n)] if r == 0 else None
    dist.gather(x, g_c, dst=0)
    dist.gather(x.to(dev()), g_d, dst=0)
    if r == 0:
        for a, b in zip(g_d, g_c):
            close(a, b, f"gather {dtype}")
    sc_in = [_value((size,), dtype, seed=50 + j) for j in range(n)] if r == 1 else None
    s_c, s_d = torch.empty_like(x), torch.empty_like(x, device=dev())
    dist.scatter(s_c, sc_in, src=1)
    dist.scatter(s_d, [t.to(dev()) for t in sc_in] if sc_in else None, src=1)
    close(s_d, s_c, f"scatter {dtype}")
    # send/recv with tags, in both directions: sent in one order, received in the other, so a
    # receive that ignored its tag would get the other message
    peer = 1 - r
    def payload(q, tag):
        return _value((size,), dtype, seed=q * 100 + size + tag)
    for sender in (0, 1):
        if r == sender:
            works = [dist.isend(payload(r, tag).to(dev()), dst=peer, tag=tag) for tag in (4, 3)]
            for w in works:
                w.wait()
        else:
            for tag in (3, 4):
                got = torch.empty(size, dtype=dtype, device=dev())
                dist.recv(got, src=peer, tag=tag)
                close(got, payload(peer, tag), f"send/recv tag {tag} {dtype}")
    # a receive from any source reports the sender
    if r == 0:
        dist.send(payload(r, 9).to(dev()), dst=peer, tag=9)
    elif r == 1:
        got = torch.empty(size, dtype=dtype, device=dev())
        src = dist.recv(got, tag=9)
        assert src == 0, f"recv from any source: sender {src}"
        close(got, payload(0, 9), f"recv from any source {dtype}")
    checked += 14
    return checked


@job
def inference_mode(out):
    """Every collective on inference tensors inside torch.inference_mode(), as vLLM runs its
    tensor-parallel model (works under no_grad; an in-place update of an inference tensor
    outside inference mode raises)."""
    with torch.inference_mode():
        checked = _every_collective(torch.float32, 1000) + _every_collective(torch.int64, 1 << 20, every_op=False)
        t = torch.ones(4, device=dev())
        assert t.is_inference()
        dist.all_reduce(t)
        close(t, torch.full((4,), float(world())), "all_reduce of an inference tensor")
    return {"checked": checked + 1}


@job
def collectives(out):
    r, n = rank(), world()
    RO = dist.ReduceOp
    checked = 0
    for dtype in DTYPES + (torch.float64, torch.int8, torch.uint8):
        for size in (0, 1, 1023):
            checked += _every_collective(dtype, size)
    # the coalesced forms and functional collectives
    a, b = torch.ones(4, device=dev()) * (r + 1), torch.ones(6, device=dev()) * (r + 2)
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    close(a, torch.full((4,), 3.0), "all_reduce coalesced")
    close(b, torch.full((6,), 5.0), "all_reduce coalesced")
    outs = [torch.empty(2 * n, device=dev()) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o in outs:
            dist.all_gather_into_tensor(o, torch.full((2,), float(r), device=dev()))
    cm.wait()
    close(outs[1], torch.tensor([0., 0., 1., 1.]), "all_gather_into_tensor coalesced")
    rs = [torch.empty(2, device=dev()) for _ in range(2)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o in rs:
            dist.reduce_scatter_tensor(o, torch.arange(4.0, device=dev()))
    cm.wait()
    close(rs[0], torch.arange(4.0).view(n, 2)[r] * n, "reduce_scatter_tensor coalesced")
    sendb, recvb = torch.full((3,), float(r), device=dev()), torch.empty(3, device=dev())
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, sendb, (r + 1) % n),
                                   dist.P2POp(dist.irecv, recvb, (r - 1) % n)])
    for q in reqs:
        q.wait()
    close(recvb, torch.full((3,), float((r - 1) % n)), "batch_isend_irecv")
    import torch.distributed._functional_collectives as fc
    y = fc.all_reduce(torch.ones(5, device=dev()) * (r + 1), "sum", dist.group.WORLD)
    close(y, torch.full((5,), 3.0), "functional all_reduce")
    z = fc.all_gather_tensor(torch.full((2,), float(r), device=dev()), 0, dist.group.WORLD)
    close(z, torch.tensor([0., 0., 1., 1.]), "functional all_gather_tensor")
    w = fc.reduce_scatter_tensor(torch.arange(4.0, device=dev()), "sum", 0, dist.group.WORLD)
    close(w, torch.arange(4.0).view(n, 2)[r] * n, "functional reduce_scatter_tensor")
    # 64 MB: all_reduce and all_gather_into_tensor
    big = _value((16 << 20,), torch.float32, seed=r)
    c, d = _run_both(lambda t: dist.all_reduce(t), big)
    close(d[0], c[0], "all_reduce 64MB")
    g_c, g_d = torch.empty(n << 24), torch.empty(n << 24, device=dev())
    dist.all_gather_into_tensor(g_c, big)
    dist.all_gather_into_tensor(g_d, big.to(dev()))
    close(g_d, g_c, "all_gather_into_tensor 64MB")
    # async work: wait() orders the current stream, the host runs ahead
    t = torch.ones(1 << 20, device=dev())
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    fut = dist.all_reduce(torch.ones(3, device=dev()), async_op=True).get_future()
    close(fut.wait()[0], torch.full((3,), float(n)), "future value")
    close(t[:4], torch.full((4,), float(n)), "async all_reduce")
    dist.barrier()
    checked += 12
    return {"checked": checked}


@job
def collectives_64mb(out):
    """Every collective at 64 MB per rank, for every dtype: the transport's large-message paths
    (segmented rings, partial socket writes) rather than the small-message ones."""
    checked = 0
    for dtype in DTYPES:
        checked += _every_collective(dtype, (64 << 20) // torch.empty(0, dtype=dtype).element_size(), every_op=False)
    return {"checked": checked}


def _reduced(xs, op):
    """The reduction of every rank's tensor, computed locally (the known value)."""
    RO = dist.ReduceOp
    fn = {RO.SUM: torch.add, RO.PRODUCT: torch.mul, RO.MIN: torch.minimum, RO.MAX: torch.maximum,
          RO.BAND: torch.bitwise_and, RO.BOR: torch.bitwise_or, RO.BXOR: torch.bitwise_xor}[op]
    acc = xs[0]
    for y in xs[1:]:
        acc = fn(acc, y)
    return acc


@job
def direct_algorithms(out):
    """The backend's own allreduce and all_gather_into_tensor (point-to-point over the transport)
    at any world size, sizes that do not divide by it, several segments, against values computed
    locally from every rank's input; and collectives queued back to back on one buffer, which
    must see each other's results."""
    r, n = rank(), world()
    RO = dist.ReduceOp
    checked = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        for size in (0, 1, 2, 1023, (1 << 18) - 1, (5 << 20) + 3):  # 1 MB - 4 B: direct; 20 MB: ring
            if size > (1 << 18) and dtype is not torch.float32:
                continue
            inputs = [_value((size,), dtype, seed=q * 31 + size) for q in range(n)]
            if dtype is torch.bool:
                ops = [RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR]
            elif dtype.is_floating_point:
                ops = [RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX]
            else:
                ops = [RO.SUM, RO.PRODUCT, RO.MIN, RO.MAX, RO.BAND, RO.BOR, RO.BXOR]
            # bf16: each partial sum rounds (bf16 spacing is 1/16 at magnitude 8), in an order
            # that differs from the reference's
            tol = dict(rtol=2e-2, atol=0.125) if dtype is torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
            for op in ops:
                d = inputs[r].to(dev())
                dist.all_reduce(d, op=op)
                close(d, _reduced(inputs, op), f"all_reduce {op} {dtype} n={size}", **tol)
                # every rank holds the same bits
                everyone = torch.empty(n * size, dtype=dtype, device=dev())
                dist.all_gather_into_tensor(everyone, d)
                for other in everyone.cpu().chunk(n) if size else []:
                    assert torch.equal(other, d.cpu()), f"all_reduce {op} {dtype} n={size}: ranks differ"
                checked += 1
            big = torch.empty(n * size, dtype=dtype, device=dev())
            dist.all_gather_into_tensor(big, inputs[r].to(dev()))
            assert torch.equal(big.cpu(), torch.cat(inputs)), f"all_gather_into_tensor {dtype} n={size}"
            b = inputs[r].to(dev())
            dist.broadcast(b, src=n - 1)
            assert torch.equal(b.cpu(), inputs[n - 1]), f"broadcast {dtype} n={size}"
            checked += 2
            if dtype is not torch.bool:
                whole = [_value((n * size,), dtype, seed=q * 7 + size) for q in range(n)]
                part = torch.empty(size, dtype=dtype, device=dev())
                dist.reduce_scatter_tensor(part, whole[r].to(dev()))
                close(part, _reduced(whole, RO.SUM)[r * size:(r + 1) * size], f"reduce_scatter_tensor {dtype} n={size}",
                      **tol)
                checked += 1
    # dense but not contiguous (transposed), in and out
    src = [_value((6, 5), torch.float32, seed=q).t() for q in range(n)]
    d = src[r].to(dev())
    assert not d.is_contiguous()
    dist.all_reduce(d)
    close(d, _reduced(src, RO.SUM), "all_reduce of a transposed tensor")
    gathered = torch.empty(6, 5 * n, device=dev()).t()
    dist.all_gather_into_tensor(gathered, src[r].to(dev()))
    close(gathered, torch.cat(src), "all_gather_into_tensor of transposed tensors")
    checked += 2
    # in place: the gathered tensor's own slot is the input
    buf = torch.zeros(n * 5, device=dev())
    buf[r * 5:(r + 1) * 5] = r + 1
    dist.all_gather_into_tensor(buf, buf[r * 5:(r + 1) * 5])
    close(buf, torch.arange(1.0, n + 1).repeat_interleave(5), "all_gather_into_tensor in place")
    # back to back on one buffer, without waiting in between: n ** 4
    for numel in (1 << 10, 1 << 20):
        t = torch.ones(numel, device=dev())
        works = [dist.all_reduce(t, async_op=True) for _ in range(4)]
        for w in works:
            w.wait()
        close(t, torch.full((numel,), float(n ** 4)), f"4 queued all_reduces of one buffer ({numel})")
        g = torch.ones(numel, device=dev())
        outs = torch.empty(n * numel, device=dev())
        w1 = dist.all_reduce(g, async_op=True)
        w2 = dist.all_gather_into_tensor(outs, g, async_op=True)
        w1.wait(), w2.wait()
        close(outs, torch.full((n * numel,), float(n)), "all_gather after a queued all_reduce of its input")
        checked += 2
    return {"checked": checked, "peer_access": _peer_access()}


# ----------------------------------------------------------------------- training jobs

STEPS = 10


def _batch(step, d_in=16, n=8):
    g = torch.Generator().manual_seed(1000 * step + rank())
    return torch.randn(n, d_in, generator=g), torch.randn(n, 4, generator=g)


def _mlp(d_in=16, hidden=32, d_out=4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, d_out))


def _grads(params):
    """This rank's view of every parameter's gradient (whole, for DTensors: a collective, so
    every rank calls it at the same point), None where there is none."""
    out = []
    for p in params:
        g = p.grad
        if g is not None and hasattr(g, "full_tensor"):
            g = g.full_tensor()
        out.append(None if g is None else g.detach().cpu().clone())
    return out


def _compare_runs(name, runs, rtol=1e-5, atol=1e-5):
    """runs[device] = (losses, final parameters, gradients before each optimizer step)."""
    (cl, cp, cg), (nl, np_, ng) = runs["cpu"], runs["neuron"]
    close(torch.tensor(nl), torch.tensor(cl), f"{name}: losses", rtol=rtol, atol=atol)
    assert len(cp) == len(np_)
    for i, (a, b) in enumerate(zip(np_, cp)):
        close(a, b, f"{name}: parameter {i}", rtol=rtol, atol=atol)
    assert len(cg) == len(ng) == len(cl), (len(cg), len(ng), len(cl))
    grads = 0
    for step, (gn, gc) in enumerate(zip(ng, cg)):
        assert len(gn) == len(gc)
        for i, (a, b) in enumerate(zip(gn, gc)):
            assert (a is None) == (b is None), f"{name}: step {step} gradient {i}: None on one device only"
            if a is not None:
                close(a, b, f"{name}: step {step} gradient {i}", rtol=rtol, atol=atol)
                grads += 1
    assert grads > 0, f"{name}: no gradients compared"
    return {"steps": len(cl), "params": len(cp), "grads": grads, "final_loss": nl[-1]}


class WithUnused(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = _mlp()
        self.unused = nn.Linear(4, 4)  # never called: DDP(find_unused_parameters=True)

    def forward(self, x):
        return self.body(x)


@job
def ddp(out):
    from torch.nn.parallel import DistributedDataParallel as DDP
    res = {}
    for find_unused in (False, True):
        runs = {}
        for device in ("cpu", "neuron"):
            d = torch.device("cpu") if device == "cpu" else dev()
            model = (WithUnused() if find_unused else _mlp()).to(d)
            # a tiny bucket cap: several buckets, each its own allreduce; on neuron also the way
            # CUDA scripts call it (device_ids, gradients as views of the buckets)
            extra = dict(device_ids=[d.index], gradient_as_bucket_view=True) if device == "neuron" and find_unused else {}
            ddp_model = DDP(model, bucket_cap_mb=0.001, find_unused_parameters=find_unused, **extra)
            opt = torch.optim.SGD(ddp_model.parameters(), lr=0.05, momentum=0.9)
            losses, grads = [], []
            for step in range(STEPS):
                x, y = (t.to(d) for t in _batch(step))
                if step % 3 == 1:  # gradient accumulation: no allreduce on the first micro-batch
                    with ddp_model.no_sync():
                        nn.functional.mse_loss(ddp_model(x[:4]), y[:4]).backward()
                    loss = nn.functional.mse_loss(ddp_model(x[4:]), y[4:])
                else:
                    loss = nn.functional.mse_loss(ddp_model(x), y)
                loss.backward()
                grads.append(_grads(model.parameters()))
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            runs[device] = (losses, [p.detach().cpu() for p in model.parameters()], grads)
            if device == "neuron":  # DDP's runtime statistics, timed by our reducer timer
                data = ddp_model._get_ddp_logging_data()
                res[f"timer find_unused={find_unused}"] = {k: data.get(k) for k in (
                    "avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time")}
        res[f"find_unused={find_unused}"] = _compare_runs("ddp", runs)
    # replicas stay identical across ranks
    gathered = [None] * world()
    dist.all_gather_object(gathered, [p.sum().item() for p in runs["neuron"][1]])
    assert gathered[0] == gathered[-1], "DDP replicas diverged"
    return res


@job
def fsdp2(out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    meshes = {"cpu": init_device_mesh("cpu", (world(),)), "neuron": init_device_mesh("neuron", (world(),))}
    configs = {
        "default": {},
        "bf16_params_fp32_reduce": dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                                        reduce_dtype=torch.float32)),
        "no_reshard_after_forward": dict(reshard_after_forward=False),
        "cpu_offload": dict(offload_policy=CPUOffloadPolicy()),
    }
    res = {}
    for name, cfg in configs.items():
        runs = {}
        for device in ("cpu", "neuron"):
            kw = dict(cfg)
            if device == "cpu":
                kw.pop("offload_policy", None)  # the reference: same math, no offload
            model = _mlp().to("cpu" if device == "cpu" or "offload_policy" in kw else dev())
            for layer in model:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer, mesh=meshes[device], **kw)
            fully_shard(model, mesh=meshes[device], **kw)
            if "offload_policy" in kw:
                assert all(p.device.type == "cpu" for p in model.parameters())
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            losses, grads = [], []
            for step in range(STEPS):
                x, y = (t.to("cpu" if device == "cpu" else dev()) for t in _batch(step))
                loss = nn.functional.mse_loss(model(x).float(), y)
                loss.backward()
                grads.append(_grads(model.parameters()))
                opt.step()
                opt.zero_grad()
                losses.append(loss.item())
            runs[device] = (losses, [p.full_tensor().detach().cpu() for p in model.parameters()], grads)
        tol = dict(rtol=2e-2, atol=2e-2) if "bf16" in name else dict(rtol=1e-5, atol=1e-5)
        res[name] = _compare_runs(f"fsdp2 {name}", runs, **tol)
    return res


class Attention(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        def split(t):  # head dim 8: a tensor-parallel rank holds a subset of the heads
            return t.view(b, s, -1, 8).transpose(1, 2)
        q, k, v = (split(f(x)) for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.attn = Attention(d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.down(nn.functional.gelu(self.up(x)))


@job
def tensor_parallel(out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
    runs = {}
    for device in ("cpu", "neuron"):
        mesh = init_device_mesh(device, (world(),))
        torch.manual_seed(0)
        model = Block().to("cpu" if device == "cpu" else dev())
        parallelize_module(model, mesh, plan)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        losses, grads = [], []
        for step in range(STEPS):
            g = torch.Generator().manual_seed(step)  # TP: every rank sees the same batch
            x = torch.randn(2, 8, 32, generator=g).to("cpu" if device == "cpu" else dev())
            loss = model(x).square().mean()
            loss.backward()
            grads.append(_grads(model.parameters()))
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs[device] = (losses, [p.full_tensor().detach().cpu() for p in model.parameters()], grads)
    return {"block": _compare_runs("tensor parallel", runs, rtol=1e-4, atol=1e-5)}


@job
def pipeline_parallel(out):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    res = {}
    for sched_cls in (ScheduleGPipe, Schedule1F1B):
        runs = {}
        for device in ("cpu", "neuron"):
            d = torch.device("cpu") if device == "cpu" else dev()
            full = _mlp()
            stage_mod = (full[:2] if rank() == 0 else full[2:]).to(d)
            stage = PipelineStage(stage_mod, stage_index=rank(), num_stages=world(), device=d)
            sched = sched_cls(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
            opt = torch.optim.SGD(stage_mod.parameters(), lr=0.05)
            losses, grads = [], []
            for step in range(STEPS):
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(8, 16, generator=g).to(d), torch.randn(8, 4, generator=g).to(d)
                if rank() == 0:
                    sched.step(x)
                    losses.append(0.0)
                else:
                    mb = []
                    sched.step(target=y, losses=mb)
                    losses.append(torch.stack([m.detach().cpu() for m in mb]).mean().item())
                grads.append(_grads(stage_mod.parameters()))
                opt.step()
                opt.zero_grad()
            runs[device] = (losses, [p.detach().cpu() for p in stage_mod.parameters()], grads)
        res[sched_cls.__name__] = _compare_runs(sched_cls.__name__, runs)
    return res


@job
def zero(out):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    runs = {}
    for device in ("cpu", "neuron"):
        d = torch.device("cpu") if device == "cpu" else dev()
        model = DDP(_mlp().to(d))
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2)
        losses, grads = [], []
        for step in range(STEPS):
            x, y = (t.to(d) for t in _batch(step))
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads.append(_grads(model.parameters()))
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs[device] = (losses, [p.detach().cpu() for p in model.parameters()], grads)
        owned = sum(p.numel() for g in opt.optim.param_groups for p in g["params"])
        assert owned < sum(p.numel() for p in model.parameters()), "ZeRO should shard optimizer state"
    return {"zero": _compare_runs("zero", runs)}


@job
def dtensor(out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
    n = world()
    shapes = {"1d": (n,), "2d": (n // 2, 2) if n >= 4 else (1, n)}
    checked = 0
    full = torch.arange(8 * 12, dtype=torch.float32).view(8, 12)
    for name, shape in shapes.items():
        mesh = init_device_mesh("neuron", shape)
        k = len(shape)
        for placements in ([Shard(0)] * k, [Replicate()] * k, [Shard(1)] + [Replicate()] * (k - 1),
                           [Replicate()] * (k - 1) + [Shard(0)]):
            dt = distribute_tensor(full, mesh, placements)
            assert dt.to_local().device.type == "neuron"
            close(dt.full_tensor(), full, f"{name} {placements} full_tensor")
            for target in ([Replicate()] * k, [Shard(1)] * k if k == 1 else [Shard(0), Shard(1)]):
                close(dt.redistribute(mesh, target).full_tensor(), full, f"{name} {placements}->{target}")
                checked += 1
        # Partial -> Replicate is an all-reduce
        from torch.distributed.tensor import DTensor
        local = torch.ones(3, 4, device=dev()) * (rank() + 1)
        p = DTensor.from_local(local, mesh, [Partial()] + [Replicate()] * (k - 1))
        r = p.redistribute(mesh, [Replicate()] * k).to_local().cpu()
        group0 = mesh.get_group(0)
        members = dist.get_process_group_ranks(group0)
        close(r, torch.ones(3, 4) * sum(m + 1 for m in members), f"{name} Partial->Replicate")
        # Partial -> Shard is a reduce-scatter; a max Partial reduces with MAX
        local = torch.arange(4.0 * 4, device=dev()).view(4, 4) * (rank() + 1)
        p = DTensor.from_local(local, mesh, [Partial()] + [Replicate()] * (k - 1))
        sh = p.redistribute(mesh, [Shard(0)] + [Replicate()] * (k - 1))
        close(sh.full_tensor(), torch.arange(16.0).view(4, 4) * sum(m + 1 for m in members), f"{name} Partial->Shard(0)")
        pm = DTensor.from_local(local, mesh, [Partial("max")] + [Replicate()] * (k - 1))
        close(pm.redistribute(mesh, [Replicate()] * k).to_local(), torch.arange(16.0).view(4, 4) * max(m + 1 for m in members),
              f"{name} Partial(max)->Replicate")
        checked += 2
        # a matmul of sharded DTensors matches the full one
        a = distribute_tensor(full, mesh, [Shard(0)] + [Replicate()] * (k - 1))
        b = distribute_tensor(full.t().contiguous(), mesh, [Replicate()] * k)
        close((a @ b).full_tensor(), full @ full.t(), f"{name} sharded matmul")
        checked += 2
    # new_group subgroups: each pair reduces among itself
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])] if n == 4 else []
    for g in pairs:
        members = dist.get_process_group_ranks(g)
        if rank() in members:
            t = torch.full((5,), float(rank() + 1), device=dev())
            dist.all_reduce(t, group=g)
            close(t, torch.full((5,), float(sum(m + 1 for m in members))), f"all_reduce in new_group({members})")
            checked += 1
    return {"checked": checked}


@job
def dtensor_random(out):
    """DTensor's random ops on a neuron mesh (OffsetBasedRNGTracker over the generator's
    (seed, offset) state): with the same seed on every rank, a tensor sharded on dim 0 gets, shard
    by shard, the values the unsharded tensor gets on one device; replicas are equal; every rank's
    generator ends at the same offset; a TP-parallelized module initialises its shards apart."""
    import torch.distributed.tensor as dt
    import torch.distributed.tensor._random as dt_random
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    n = world()
    mesh = init_device_mesh("neuron", (n,))
    checked = 0
    for dtype in (torch.float32, torch.bfloat16):
        for init, name in ((lambda t: t.uniform_(-1, 1), "uniform_"), (lambda t: t.normal_(0, 0.02), "normal_"),
                           (lambda t: torch.nn.init.kaiming_uniform_(t, a=5 ** 0.5), "kaiming_uniform_")):
            shape = (64 * n, 48)
            torch.manual_seed(1234)
            sharded = init(dt.empty(shape, device_mesh=mesh, placements=[Shard(0)], dtype=dtype))
            replicated = init(dt.empty(shape, device_mesh=mesh, placements=[Replicate()], dtype=dtype))
            offset = torch.neuron.default_generators[torch.neuron.current_device()].get_offset()
            # One device, same seed and the same two ops in order.
            g = torch.Generator(device=dev()).manual_seed(1234)
            ref = [torch.empty(shape, device=dev(), dtype=dtype) for _ in range(2)]
            for t in ref:
                with torch.random.fork_rng(devices=[dev()], device_type="neuron"):
                    torch.neuron.set_rng_state(g.get_state())
                    init(t)
                    g.set_state(torch.neuron.get_rng_state())
            rows = slice(rank() * 64, (rank() + 1) * 64)
            close(sharded.to_local(), ref[0][rows], f"{name} {dtype} Shard(0) local", rtol=0, atol=0)
            close(sharded.full_tensor(), ref[0], f"{name} {dtype} Shard(0) full", rtol=0, atol=0)
            close(replicated.to_local(), ref[1], f"{name} {dtype} Replicate", rtol=0, atol=0)
            offsets = [None] * n
            dist.all_gather_object(offsets, offset)
            assert len(set(offsets)) == 1, f"{name}: generator offsets differ across ranks: {offsets}"
            checked += 4
    assert isinstance(dt_random._rng_tracker, dt_random.OffsetBasedRNGTracker)
    # Tensor parallel meta init: each rank's shard of the weight differs from the others'.
    torch.manual_seed(0)
    with torch.device("meta"):
        model = torch.nn.Linear(32, 16 * n, bias=False)
    parallelize_module(model, mesh, ColwiseParallel())
    model.to_empty(device=dev())
    model.reset_parameters()
    local = model.weight.to_local()
    gathered = [torch.empty_like(local) for _ in range(n)]
    dist.all_gather(gathered, local)
    assert all(not torch.equal(gathered[i], gathered[j]) for i in range(n) for j in range(i + 1, n))
    checked += 1
    return {"checked": checked}


@job
def dcp_save(out):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("neuron", (world(),))
    model = _mlp().to(dev())
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x, y = (t.to(dev()) for t in _batch(step))
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    sd = get_model_state_dict(model)
    assert all(v.to_local().device.type == "neuron" for v in sd.values())
    dcp.save(sd, checkpoint_id=os.path.join(out, "ckpt"))
    full = {k: v.full_tensor().cpu() for k, v in sd.items()}
    if rank() == 0:
        torch.save(full, os.path.join(out, "reference.pt"))
    return {"tensors": len(full)}


@job
def dcp_load(out):
    """Reload the 2-rank checkpoint with a different world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("neuron", (world(),))
    torch.manual_seed(123)  # different initial weights: the load must replace them
    model = _mlp().to(dev())
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    sd = get_model_state_dict(model)
    dcp.load(sd, checkpoint_id=os.path.join(out, "ckpt"))
    set_model_state_dict(model, sd)
    ref = torch.load(os.path.join(out, "reference.pt"))
    got = get_model_state_dict(model)
    for k, v in ref.items():
        close(got[k].full_tensor(), v, f"reloaded {k}", rtol=0, atol=0)
    return {"tensors": len(ref), "world": world()}


# ----------------------------------------------------------------------- failures

@job
def peer_dies(out):
    """Rank 1 dies while a 256 MB all_reduce is moving (its data half sent), without a word to
    the others: rank 0's all_reduce raises."""
    t = torch.ones(1000, device=dev())
    dist.all_reduce(t)
    t.cpu()
    big = torch.ones(64 << 20, device=dev())
    start = time.time()
    if rank() == 1:
        dist.all_reduce(big, async_op=True)
        time.sleep(0.05)
        os._exit(17)
    try:
        dist.all_reduce(big)
        big.cpu()
    except Exception as e:  # noqa: BLE001
        return {"raised": type(e).__name__, "message": str(e)[:500], "after_s": time.time() - start}
    raise AssertionError("all_reduce with a dead peer did not raise")


@job
def peer_stalls(out):
    """The last rank is alive but never joins the all_reduce: every other rank raises once the
    group's timeout (JOB_TIMEOUT_S) has passed, not before and not much after."""
    t = torch.ones(1000, device=dev())
    dist.all_reduce(t)
    t.cpu()
    if rank() == world() - 1:
        time.sleep(float(os.environ["JOB_TIMEOUT_S"]) + 10)
        os._exit(0)  # its peers have given up on the group
    start = time.time()
    try:
        dist.all_reduce(t)
        t.cpu()
    except Exception as e:  # noqa: BLE001
        return {"raised": type(e).__name__, "message": str(e)[:500], "after_s": time.time() - start}
    raise AssertionError("all_reduce with a stalled peer did not raise")


def _peer_fault_in_training(wrap, install_fault):
    """Rank 1 fails inside a training step, as PEER_FAULT says: `kill` (SIGKILL: no exit handlers,
    sockets closed by the kernel) or `stall` (alive, but never goes on). Rank 0's step must raise
    (at once for a dead peer, at the group's timeout for a stalled one), and its device must
    still work."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)]).to(dev())
    model = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 1024, device=dev())
    model(x).square().mean().backward()  # one whole step first: the group works
    opt.step()
    opt.zero_grad()
    torch.neuron.synchronize()
    if rank() == 1:
        install_fault(model, _fail_self)
    start = time.time()
    try:
        model(x).square().mean().backward()
        opt.step()
        torch.neuron.synchronize()
    except Exception as e:  # noqa: BLE001
        after = time.time() - start
        probe = (torch.arange(4.0, device=dev()) * 2).cpu().tolist()  # the device still works
        return {"raised": type(e).__name__, "message": str(e)[:500], "after_s": after, "probe": probe}
    raise AssertionError(f"a training step with a peer that failed ({os.environ['PEER_FAULT']}) did not raise")


def _fail_self():
    if os.environ["PEER_FAULT"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(float(os.environ["JOB_TIMEOUT_S"]) + 10)  # stall: the peers give up on the group first
    os._exit(0)


@job
def ddp_peer_fault(out):
    """DDP: rank 1's comm hook starts its bucket's allreduce, then the rank fails mid-collective."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def in_allreduce(model, fail):
        def hook(state, bucket):
            work = dist.all_reduce(bucket.buffer(), async_op=True)
            time.sleep(0.05)
            fail()
            return work.get_future().then(lambda f: f.value()[0])
        model.register_comm_hook(None, hook)

    return _peer_fault_in_training(lambda m: DDP(m, device_ids=[dev().index], bucket_cap_mb=1), in_allreduce)


@job
def fsdp2_peer_fault(out):
    """FSDP2: rank 1 fails as its last layer's parameters arrive in the forward; rank 0 goes on
    to the backward's all-gather and reduce-scatter without it."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("neuron", (world(),))

    def wrap(model):
        for layer in model:
            fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    def in_forward(model, fail):
        model[-1].register_forward_pre_hook(lambda m, args: fail())

    return _peer_fault_in_training(wrap, in_forward)


@job
def mismatch(out):
    """Ranks that disagree (all_reduce sizes; all-to-all splits, where each rank's own sizes are
    consistent but rank 1 expects 5 elements from rank 0, which sends 4) get an error on every
    rank before any data moves, and the group stays usable."""
    res = {}
    r = rank()
    sends, receives = ([2, 4], [2, 3]) if r == 0 else ([3, 3], [5, 3])
    cases = {
        "all_reduce": lambda: dist.all_reduce(torch.ones(10 if r == 0 else 20, device=dev())),
        "all_to_all_single": lambda: dist.all_to_all_single(
            torch.empty(sum(receives), device=dev()), torch.ones(sum(sends), device=dev()), receives, sends),
        "all_to_all": lambda: dist.all_to_all([torch.empty(k, device=dev()) for k in receives],
                                              [torch.ones(k, device=dev()) for k in sends]),
    }
    for name, call in cases.items():
        try:
            call()
            torch.neuron.synchronize()
        except Exception as e:  # noqa: BLE001
            res[name] = {"raised": type(e).__name__, "message": str(e)[:800]}
        else:
            raise AssertionError(f"mismatched {name} did not raise")
        u = torch.ones(4, device=dev())
        dist.all_reduce(u)
        close(u, torch.full((4,), float(world())), f"all_reduce after a mismatched {name}")
    return res


@job
def bad_peer_setting_on_one_rank(out):
    """Rank 1 alone has a bad TORCH_NEURONX_DIST_PEER_ACCESS when a group is created: every rank
    raises at once (the others do not wait out the timeout in the exchange)."""
    if rank() == 1:
        os.environ["TORCH_NEURONX_DIST_PEER_ACCESS"] = "maybe"
    start = time.time()
    try:
        dist.new_group(backend="neuron")
    except Exception as e:  # noqa: BLE001
        os.environ.pop("TORCH_NEURONX_DIST_PEER_ACCESS", None)
        return {"raised": type(e).__name__, "message": str(e)[:400], "after_s": time.time() - start}
    raise AssertionError("a bad TORCH_NEURONX_DIST_PEER_ACCESS did not raise")


@job
def ordering(out):
    """What NCCL's one stream per group guarantees: a send or receive queued after a collective
    on the same tensor sees its result; a barrier waits for every collective queued before it,
    including the backend's own algorithms on CPU tensors; all_gather_into_tensor's output is
    checked before anything moves. Then collectives are left in flight when the job returns
    (main() destroys the group at once: the works must outlive it)."""
    r, n = rank(), world()
    checked = 0
    for numel in (1 << 10, 1 << 18, 1 << 21):  # 4 KB and 1 MB: the exchange; 8 MB: Gloo's ring
        h = torch.full((numel,), float(r + 1), device=dev())
        w = dist.all_reduce(h, async_op=True)  # not waited for before the transfer below
        if r == 0:
            dist.send(h, dst=1)
        elif r == 1:
            got = torch.empty(numel, device=dev())
            dist.recv(got, src=0)
            close(got, torch.full((numel,), float(n * (n + 1) // 2)), f"recv after a queued all_reduce ({numel})")
        w.wait()
        checked += 1
    for numel in (1 << 10, 1 << 18):
        c = torch.full((numel,), float(r + 1))
        dist.all_reduce(c, async_op=True)
        dist.barrier()
        close(c, torch.full((numel,), float(n * (n + 1) // 2)), f"CPU all_reduce read after a barrier ({numel})")
        checked += 1
    x = torch.ones(8, device=dev())
    bad = [(torch.empty(8 * n, dtype=torch.bfloat16, device=dev()), "same dtype"),
           (torch.empty(8 * n + 1, device=dev()), "world size")]
    errors = []
    for o, what in bad:
        try:
            dist.all_gather_into_tensor(o, x)
        except ValueError as e:
            assert what in str(e), str(e)
            errors.append(str(e))
        else:
            raise AssertionError(f"all_gather_into_tensor with a bad output ({what}) did not raise")
    ok = torch.empty(8 * n, device=dev())
    dist.all_gather_into_tensor(ok, x)  # the group is still usable
    close(ok, torch.ones(8 * n), "all_gather_into_tensor after rejected outputs")
    left = [torch.ones(1 << 18, device=dev()) for _ in range(8)]
    for t in left:
        dist.all_reduce(t, async_op=True)
    return {"checked": checked, "errors": errors}


@job
def transfer_wait_timeout(out):
    """A send queued behind a collective that cannot run yet (its peer is late): wait(timeout)
    raises within the timeout, while the send waits to be issued; the send still completes
    afterwards, and the data arrives intact."""
    r = rank()
    x = torch.ones(16, device=dev())
    y = torch.arange(1024.0, device=dev())
    if r == 0:
        w = dist.all_reduce(x, async_op=True)  # the collective queue waits for rank 1's check
        s = dist.isend(y, dst=1)
        t0 = time.monotonic()
        try:
            s.wait(timeout=datetime.timedelta(milliseconds=500))
        except Exception as e:  # noqa: BLE001
            raised, message = type(e).__name__, str(e)
        else:
            raise AssertionError("wait(timeout) on a send that could not be issued did not raise")
        after = time.monotonic() - t0
        s.wait()  # the timeout did not cancel the transfer
        w.wait()
    else:
        time.sleep(4)
        dist.all_reduce(x)
        got = torch.empty(1024, device=dev())
        dist.recv(got, src=0)
        close(got, torch.arange(1024.0), "the send that timed out in wait()")
        raised, message, after = None, "", 0.0
    close(x, torch.full((16,), float(world())), "the collective ahead of the send")
    return {"raised": raised, "message": message[:400], "after_s": after}


@job
def streams(out):
    """Work.wait() makes the caller's stream wait instead of blocking the host (as NCCL), and a
    collective issued on a side stream runs after the work queued there."""
    r, n = rank(), world()
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        x = torch.zeros(1 << 16, device=dev())
        for _ in range(20):  # queued on the side stream, not yet run
            x = x + 1
        w = dist.all_reduce(x, async_op=True)
    w.wait()  # the default stream waits for the collective
    y = x * 2  # on the default stream
    close(y, torch.full((1 << 16,), 40.0 * n), "all_reduce of side-stream work, read on the default stream")
    # The peer joins 1.5 s late: wait() returns at once, the data arrives with the stream.
    t = torch.ones(8, device=dev())
    if r == 1:
        time.sleep(1.5)
    w = dist.all_reduce(t, async_op=True)
    start = time.monotonic()
    w.wait()
    waited = time.monotonic() - start
    done_at_wait = w.is_completed()
    u = t + 1  # queued behind the collective
    close(u, torch.full((8,), float(n) + 1), "compute queued after wait()")
    until_data = time.monotonic() - start
    # The host drops the collective's tensor while the collective (on its own queue) waits for a
    # late peer: the block must not go to new work on the default stream before it has run.
    size = 3 << 20
    tmp = torch.full((size,), 2.0, device=dev())
    torch.neuron.synchronize()
    tmp_ptr = tmp.data_ptr()
    if r == 1:
        time.sleep(1.0)
    w = dist.all_reduce(tmp, async_op=True)
    del tmp
    z = torch.full((size,), 7.0, device=dev())
    w.wait()
    torch.neuron.synchronize()
    close(z, torch.full((size,), 7.0), "a tensor allocated while a collective on a dropped tensor was in flight")
    return {"wait_s": waited, "completed_at_wait": done_at_wait, "until_data_s": until_data,
            "reused_during_collective": z.data_ptr() == tmp_ptr}


@job
def subgroup_at_exit(out):
    """A subgroup destroyed by the user while its parent lives on to interpreter exit (the
    parent remembers its last split), and a collective still queued at exit: the exit must
    neither deadlock nor abort."""
    sub = dist.split_group(split_ranks=[list(range(world()))])
    t = torch.ones(4, device=dev())
    dist.all_reduce(t, group=sub)
    close(t, torch.full((4,), float(world())), "all_reduce in a subgroup")
    dist.destroy_process_group(sub)
    del sub
    # Left queued at exit, behind compute work: the exit waits for it (and its tensors are
    # released before the interpreter tears down).
    a = torch.randn(512, 512, device=dev())
    for _ in range(20):
        a = a @ a / 512
    dist.all_reduce(a, async_op=True)
    return {"sum": t.cpu().tolist()}


KEEP_GROUP_AT_EXIT = {"subgroup_at_exit"}  # these end with the default group alive
# Jobs whose reference runs on CPU tensors: there, CPU tensors go to Gloo ("cpu:gloo"), so the
# reference is Gloo's, not this backend's own CPU path (which a plain "neuron" group would use).
GLOO_REFERENCE = {"collectives", "inference_mode", "collectives_64mb", "ddp", "fsdp2", "tensor_parallel", "pipeline_parallel",
                  "zero"}


@job
def launch_info(out):
    """What torchrun gives a rank: its device and the visible cores."""
    t = torch.ones(2, device="neuron")
    dist.all_reduce(t)
    return {"local_rank": int(os.environ["LOCAL_RANK"]), "current_device": torch.neuron.current_device(),
            "device_count": torch.neuron.device_count(),
            "physical_core": torch.neuron.get_device_properties(torch.neuron.current_device()).physical_core,
            "sum": t.cpu().tolist(), "backend": dist.get_backend(), "peer_access": _peer_access()}


def main():
    import faulthandler

    # A hung job shows where every thread is, before the launcher kills it.
    faulthandler.dump_traceback_later(float(os.environ.get("JOB_DUMP_S", "100")), exit=False)
    name, out = sys.argv[1], sys.argv[2]
    timeout = datetime.timedelta(seconds=float(os.environ.get("JOB_TIMEOUT_S", "60")))
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    backend = "cpu:gloo,neuron:neuron" if name in GLOO_REFERENCE else "neuron"
    if name == "launch_info":
        # No set_device: the current device comes from LOCAL_RANK (or NEURON_RT_VISIBLE_CORES).
        if os.environ.get("LAUNCH_INIT") == "device_id":  # the backend follows from the device
            dist.init_process_group(timeout=timeout, device_id=torch.device("neuron", torch.neuron.current_device()))
        else:
            dist.init_process_group(backend, timeout=timeout)
    else:
        # As with CUDA: each rank makes its device current, then joins the group.
        torch.neuron.set_device(local % torch.neuron.device_count())
        dist.init_process_group(backend, timeout=timeout,
                                device_id=torch.device("neuron", local % torch.neuron.device_count()))
    result = JOBS[name](out)
    with open(os.path.join(out, f"{name}.rank{rank()}.json"), "w") as f:
        json.dump(result, f)
    print(f"rank {rank()}: {name} ok (peer access {_peer_access()})", flush=True)
    if name not in KEEP_GROUP_AT_EXIT:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
