"""Device memory: the caching allocator's statistics (CUDA names), pools, empty_cache,
peaks, memory_summary, torch.accelerator memory API, out-of-memory errors, pinned memory.

Exact accounting checks run on neuron:1, which the rest of the suite rarely uses, after a
cleanup (gc, synchronize, empty_cache); sizes are chosen so that cached blocks left by other
tests cannot serve them.
"""
import copy
import gc
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import clean_env, fresh_large_size

MiB = 1 << 20
DEV = 1  # device for exact accounting checks


def _clean(device=DEV):
    gc.collect()
    torch.neuron.synchronize(device)
    torch.neuron.empty_cache()


def _stat(key, device=DEV):
    return torch.neuron.memory_stats(device)[key]


def _u8(n, device=DEV):
    return torch.empty(n, dtype=torch.uint8, device=f"neuron:{device}")


# --------------------------------------------------------------------------- stats names


_CUDA_STAT_GROUPS = ["allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                     "active_bytes", "inactive_split_bytes", "requested_bytes"]
_CUDA_SCALARS = ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "max_split_size"]


def test_memory_stats_has_cuda_keys():
    torch.neuron.init()
    st = torch.neuron.memory_stats(0)
    for g in _CUDA_STAT_GROUPS:
        for pool in ("all", "large_pool", "small_pool"):
            for m in ("current", "peak", "allocated", "freed"):
                key = f"{g}.{pool}.{m}"
                assert key in st, key
                assert isinstance(st[key], int), key
    for k in _CUDA_SCALARS:
        assert k in st and isinstance(st[k], int), k
    for k in ("oversize_allocations", "oversize_segments"):
        for m in ("current", "peak", "allocated", "freed"):
            assert f"{k}.{m}" in st
    assert list(st.keys()) == sorted(st.keys())  # OrderedDict sorted like CUDA's
    # Accounting identities.
    for pool in ("all", "large_pool", "small_pool"):
        assert st[f"reserved_bytes.{pool}.current"] >= st[f"allocated_bytes.{pool}.current"] >= 0
        assert st[f"allocated_bytes.{pool}.peak"] >= st[f"allocated_bytes.{pool}.current"]
        assert (st[f"allocated_bytes.{pool}.allocated"] - st[f"allocated_bytes.{pool}.freed"]
                == st[f"allocated_bytes.{pool}.current"])
    for g in _CUDA_STAT_GROUPS:
        for m in ("current", "allocated", "freed"):
            if g.startswith("inactive_split"):
                continue
            assert st[f"{g}.all.{m}"] == st[f"{g}.large_pool.{m}"] + st[f"{g}.small_pool.{m}"], (g, m)


def test_memory_allocated_matches_stats_and_accelerator():
    _clean()
    x = _u8(3 * MiB)
    st = torch.neuron.memory_stats(DEV)
    assert torch.neuron.memory_allocated(DEV) == st["allocated_bytes.all.current"]
    assert torch.neuron.memory_reserved(DEV) == st["reserved_bytes.all.current"]
    assert torch.neuron.max_memory_allocated(DEV) == st["allocated_bytes.all.peak"]
    assert torch.neuron.max_memory_reserved(DEV) == st["reserved_bytes.all.peak"]
    assert torch.accelerator.memory_allocated(DEV) == torch.neuron.memory_allocated(DEV)
    assert torch.accelerator.memory_reserved(DEV) == torch.neuron.memory_reserved(DEV)
    assert torch.accelerator.max_memory_allocated(DEV) == torch.neuron.max_memory_allocated(DEV)
    assert torch.accelerator.max_memory_reserved(DEV) == torch.neuron.max_memory_reserved(DEV)
    acc = torch.accelerator.memory_stats(DEV)
    for k in ("allocated_bytes.all.current", "reserved_bytes.large_pool.current", "allocation.all.current",
              "num_ooms", "requested_bytes.all.current"):
        assert acc[k] == st[k], k
    assert tuple(torch.accelerator.get_memory_info(DEV)) == tuple(torch.neuron.mem_get_info(DEV))
    # Current device default.
    with torch.neuron.device(DEV):
        assert torch.neuron.memory_allocated() == torch.neuron.memory_allocated(DEV)
        assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated(DEV)
    assert torch.neuron.memory_allocated(f"neuron:{DEV}") == torch.neuron.memory_allocated(DEV)
    del x


def test_allocate_and_free_exact_accounting():
    _clean()
    base = torch.neuron.memory_allocated(DEV)
    base_req = _stat("requested_bytes.all.current")
    base_n = _stat("allocation.all.current")
    x = torch.empty(1000, 1024, dtype=torch.float32, device=f"neuron:{DEV}")  # 4,096,000 bytes
    assert torch.neuron.memory_allocated(DEV) - base == 4_096_000  # a multiple of 512: no rounding
    assert _stat("requested_bytes.all.current") - base_req == 4_096_000
    assert _stat("allocation.all.current") - base_n == 1
    y = _u8(1000)  # rounded to 512 bytes granularity
    assert torch.neuron.memory_allocated(DEV) - base == 4_096_000 + 1024
    assert _stat("requested_bytes.all.current") - base_req == 4_097_000
    del x, y
    torch.neuron.synchronize(DEV)
    assert torch.neuron.memory_allocated(DEV) == base
    assert _stat("allocation.all.current") == base_n


def test_views_do_not_allocate():
    _clean()
    x = _u8(4 * MiB)
    base = torch.neuron.memory_allocated(DEV)
    v = x.view(2, -1)[1]
    w = x[10:100]
    assert torch.neuron.memory_allocated(DEV) == base
    del x
    torch.neuron.synchronize(DEV)
    # The views keep the storage alive.
    assert torch.neuron.memory_allocated(DEV) == base
    del v, w
    assert torch.neuron.memory_allocated(DEV) == base - 4 * MiB


def test_ops_allocate_outputs_and_free_them():
    _clean()
    a = torch.randn(512, 512, device=f"neuron:{DEV}")  # 1 MiB
    base = torch.neuron.memory_allocated(DEV)
    b = a * 2 + 1  # the temporary (a * 2) is freed once its task completed
    c = a @ a
    torch.neuron.synchronize(DEV)
    assert torch.neuron.memory_allocated(DEV) - base == 2 * MiB
    ref = a.cpu()
    torch.testing.assert_close(b.cpu(), ref * 2 + 1)
    torch.testing.assert_close(c.cpu(), ref @ ref)
    del b, c
    torch.neuron.synchronize(DEV)
    assert torch.neuron.memory_allocated(DEV) == base


@pytest.mark.parametrize("nbytes,pool", [(512, "small_pool"), (1000, "small_pool"), (MiB, "small_pool"),
                                         (MiB + 512, "large_pool"), (5 * MiB, "large_pool")])
def test_small_vs_large_pool(nbytes, pool):
    _clean()
    other = "large_pool" if pool == "small_pool" else "small_pool"
    before = {p: _stat(f"allocated_bytes.{p}.current") for p in ("small_pool", "large_pool")}
    x = _u8(nbytes)
    rounded = (nbytes + 511) // 512 * 512
    assert _stat(f"allocated_bytes.{pool}.current") - before[pool] == rounded
    assert _stat(f"allocated_bytes.{other}.current") == before[other]
    assert _stat(f"reserved_bytes.{pool}.current") >= _stat(f"allocated_bytes.{pool}.current")
    del x


def test_small_pool_segment_is_2mib_large_pool_segment_is_20mib():
    # CUDA's sizes: small requests are carved out of 2 MiB segments, 1..10 MiB requests out of
    # 20 MiB segments. Allocating more than the cached free space makes new segments unavoidable.
    _clean()

    def segments(kind):
        return {s["address"]: s for s in torch.neuron.memory_snapshot(DEV) if s["segment_type"] == kind}

    def free_bytes(segs):
        return sum(b["size"] for s in segs.values() for b in s["blocks"] if b["state"] != "active_allocated")

    small0, large0 = segments("small"), segments("large")
    keep = [_u8(MiB) for _ in range(free_bytes(small0) // MiB + 2)]
    new_small = {a: s for a, s in segments("small").items() if a not in small0}
    assert new_small, "no new small segment"
    assert {s["total_size"] for s in new_small.values()} == {2 * MiB}
    keep += [_u8(5 * MiB) for _ in range(free_bytes(large0) // (5 * MiB) + 2)]
    new_large = {a: s for a, s in segments("large").items() if a not in large0}
    assert new_large, "no new large segment"
    assert {s["total_size"] for s in new_large.values()} == {20 * MiB}
    del keep


def test_large_allocation_gets_own_rounded_segment():
    _clean()
    n = fresh_large_size(DEV) + 3 * 512  # not a 2 MiB multiple
    r0 = torch.neuron.memory_reserved(DEV)
    x = _u8(n)
    seg = (n + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
    assert torch.neuron.memory_reserved(DEV) - r0 == seg
    del x


def test_empty_cache_lowers_reserved():
    _clean()
    n = fresh_large_size(DEV)
    a0, r0 = torch.neuron.memory_allocated(DEV), torch.neuron.memory_reserved(DEV)
    free0, total = torch.neuron.mem_get_info(DEV)
    x = _u8(n)
    x.fill_(7)
    assert int(x[-1].item()) == 7
    assert torch.neuron.memory_allocated(DEV) - a0 == n
    assert torch.neuron.memory_reserved(DEV) - r0 == n
    assert torch.neuron.mem_get_info(DEV) == (free0 - n, total)
    del x
    torch.neuron.synchronize(DEV)
    # Freed memory stays cached: reserved unchanged, allocated back to the start.
    assert torch.neuron.memory_allocated(DEV) == a0
    assert torch.neuron.memory_reserved(DEV) - r0 == n
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved(DEV) == r0
    assert torch.neuron.mem_get_info(DEV) == (free0, total)


def test_empty_cache_keeps_live_tensors():
    _clean()
    x = torch.arange(3 * MiB // 8, dtype=torch.float64, device=f"neuron:{DEV}")
    r = torch.neuron.memory_reserved(DEV)
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved(DEV) == r
    assert torch.equal(x.cpu(), torch.arange(3 * MiB // 8, dtype=torch.float64))


def test_accelerator_empty_cache():
    _clean()
    n = fresh_large_size(DEV)
    r0 = torch.neuron.memory_reserved(DEV)
    x = _u8(n)
    del x
    torch.neuron.synchronize(DEV)
    assert torch.neuron.memory_reserved(DEV) == r0 + n
    torch.accelerator.empty_cache()
    assert torch.neuron.memory_reserved(DEV) == r0


def test_peak_stats_and_reset():
    _clean()
    torch.neuron.reset_peak_memory_stats(DEV)
    a0 = torch.neuron.memory_allocated(DEV)
    assert torch.neuron.max_memory_allocated(DEV) == a0
    assert torch.neuron.max_memory_reserved(DEV) == torch.neuron.memory_reserved(DEV)
    n = fresh_large_size(DEV)
    x = _u8(n)
    del x
    torch.neuron.synchronize(DEV)
    assert torch.neuron.memory_allocated(DEV) == a0
    assert torch.neuron.max_memory_allocated(DEV) == a0 + n
    assert torch.neuron.max_memory_reserved(DEV) >= torch.neuron.memory_reserved(DEV) + 0
    assert _stat("allocated_bytes.large_pool.peak") >= n
    torch.neuron.reset_peak_memory_stats(DEV)
    assert torch.neuron.max_memory_allocated(DEV) == a0
    # torch.accelerator's reset works the same way.
    y = _u8(n)
    del y
    torch.neuron.synchronize(DEV)
    assert torch.accelerator.max_memory_allocated(DEV) == a0 + n
    torch.accelerator.reset_peak_memory_stats(DEV)
    assert torch.accelerator.max_memory_allocated(DEV) == a0
    torch.neuron.reset_max_memory_allocated(DEV)
    assert torch.neuron.max_memory_allocated(DEV) == a0


def test_reset_accumulated_stats():
    _clean()
    x = _u8(4096)
    assert _stat("allocation.all.allocated") >= 1
    torch.neuron.reset_accumulated_memory_stats(DEV)
    assert _stat("allocation.all.allocated") == 0
    assert _stat("allocated_bytes.all.freed") == 0
    del x
    assert _stat("allocation.all.freed") == 1
    assert _stat("allocated_bytes.all.freed") == 4096
    torch.accelerator.reset_accumulated_memory_stats(DEV)
    assert _stat("allocation.all.freed") == 0


def test_memory_summary_contains_numbers():
    _clean()
    n = fresh_large_size(DEV, at_least=24 * MiB)
    x = _u8(n)
    s = torch.neuron.memory_summary(DEV)
    assert isinstance(s, str)
    alloc = torch.neuron.memory_allocated(DEV)
    reserved = torch.neuron.memory_reserved(DEV)

    def fmt(b):
        if b >= 1 << 30:
            return f"{b / (1 << 30):.2f} GiB"
        if b >= MiB:
            return f"{b / MiB:.2f} MiB"
        return f"{b / 1024:.2f} KiB"

    assert f"device ID {DEV}" in s
    assert fmt(alloc) in s
    assert fmt(reserved) in s
    assert "Allocated memory" in s and "Reserved memory" in s
    assert f"OOMs: {_stat('num_ooms')}" in s
    short = torch.neuron.memory_summary(DEV, abbreviated=True)
    assert fmt(alloc) in short and len(short) < len(s)
    del x


def test_memory_snapshot_consistent_with_stats():
    _clean()
    x = _u8(6 * MiB)
    y = _u8(700)
    snap = torch.neuron.memory_snapshot(DEV)
    assert sum(seg["allocated_size"] for seg in snap) == torch.neuron.memory_allocated(DEV)
    assert sum(seg["total_size"] for seg in snap) == torch.neuron.memory_reserved(DEV)
    for seg in snap:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["device"] == DEV
    del x, y


def test_memory_stats_per_device_are_separate():
    _clean(0)
    _clean(1)
    a0, a1 = torch.neuron.memory_allocated(0), torch.neuron.memory_allocated(1)
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:0")
    assert torch.neuron.memory_allocated(0) == a0 + 2 * MiB
    assert torch.neuron.memory_allocated(1) == a1
    del x


def test_tensor_freed_only_after_queued_work_completes():
    # Deleting a tensor that queued kernels still read is safe: the kernels see valid data and,
    # once they ran, the memory is back.
    _clean()
    base = torch.neuron.memory_allocated(DEV)
    a = torch.randn(256, 256, device=f"neuron:{DEV}")
    ref = a.cpu()
    outs = []
    for _ in range(20):
        outs.append((a @ a).sum())
    del a
    torch.neuron.synchronize(DEV)
    for o in outs:
        torch.testing.assert_close(o.cpu(), (ref @ ref).sum(), rtol=1e-4, atol=1e-3)
    del outs, o
    assert torch.neuron.memory_allocated(DEV) == base


# --------------------------------------------------------------------------- out of memory (subprocess)


_OOM_SCRIPT = textwrap.dedent(
    """
    import json, torch
    MiB = 1 << 20
    res = {}
    total = torch.neuron.get_device_properties(0).total_memory
    res["total"] = total
    a = torch.empty(100 * MiB, dtype=torch.uint8, device="neuron")
    b = torch.empty(100 * MiB, dtype=torch.uint8, device="neuron")
    b.fill_(5)
    res["free_before"], _ = torch.neuron.mem_get_info()
    res["reserved_before"] = torch.neuron.memory_reserved()
    res["allocated_before"] = torch.neuron.memory_allocated()
    try:
        c = torch.empty(100 * MiB, dtype=torch.uint8, device="neuron")
        res["oom"] = None
    except torch.OutOfMemoryError as e:
        res["oom"] = [type(e).__name__, isinstance(e, RuntimeError), str(e)]
    res["allocated_after_oom"] = torch.neuron.memory_allocated()
    res["num_ooms"] = torch.neuron.memory_stats()["num_ooms"]
    res["b_sum_after_oom"] = int(b.sum().item())
    # An op whose output does not fit raises OutOfMemoryError at the op; the process goes on.
    try:
        d = b.to(torch.int16)  # 200 MiB output
        res["op_oom"] = None
    except torch.OutOfMemoryError as e:
        res["op_oom"] = str(e)
    # Beyond the whole capacity.
    try:
        torch.empty(1 << 30, dtype=torch.uint8, device="neuron")
        res["huge_oom"] = None
    except torch.OutOfMemoryError as e:
        res["huge_oom"] = str(e)
    # After freeing, the same allocation succeeds and works.
    del a
    c = torch.empty(100 * MiB, dtype=torch.uint8, device="neuron")
    c.fill_(3)
    res["c_sum"] = int(c.sum().item())
    res["b_sum"] = int(b.sum().item())
    # Cached (free) memory is released automatically when a new allocation needs it.
    del b, c
    torch.neuron.synchronize()
    res["reserved_cached"] = torch.neuron.memory_stats()["reserved_bytes.large_pool.current"]
    retries0 = torch.neuron.memory_stats()["num_alloc_retries"]
    e = torch.empty(230 * MiB, dtype=torch.uint8, device="neuron")
    e[-1] = 9
    res["e_last"] = int(e[-1].item())
    res["retries"] = torch.neuron.memory_stats()["num_alloc_retries"] - retries0
    del e
    torch.neuron.empty_cache()
    # A per-process memory fraction caps what this process may reserve.
    torch.neuron.set_per_process_memory_fraction(0.25)
    try:
        torch.empty(100 * MiB, dtype=torch.uint8, device="neuron")
        res["fraction_oom"] = None
    except torch.OutOfMemoryError as e:
        res["fraction_oom"] = str(e)
    ok = torch.empty(40 * MiB, dtype=torch.uint8, device="neuron")
    res["fraction_small_ok"] = int(ok.fill_(1).sum().item())
    print(json.dumps(res))
    """
)


def _run_with_env(code, **env):
    """Run `code` in a fresh interpreter whose device settings are only `env`."""
    full = clean_env(**env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=180)


@pytest.fixture(scope="module")
def oom_result():
    import json

    p = _run_with_env(_OOM_SCRIPT, TORCH_NEURONX_SIM_HBM="256MiB")
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_oom_raises_out_of_memory_error(oom_result):
    r = oom_result
    assert r["total"] == 256 * MiB
    assert r["free_before"] == 56 * MiB
    assert r["reserved_before"] == 200 * MiB
    assert r["allocated_before"] == 200 * MiB
    assert r["oom"] is not None, "allocating past TORCH_NEURONX_SIM_HBM did not raise"
    name, is_runtime_error, msg = r["oom"]
    assert name == "OutOfMemoryError" and is_runtime_error
    assert "out of memory" in msg.lower()
    assert "100.00 MiB" in msg  # requested size
    assert "56.00 MiB" in msg and "free" in msg  # free memory
    assert "200.00 MiB" in msg and "reserved" in msg  # reserved memory
    assert "256.00 MiB" in msg  # capacity
    assert "neuron:0" in msg
    assert r["num_ooms"] == 1
    assert r["allocated_after_oom"] == 200 * MiB  # a failed allocation leaves no trace
    assert r["b_sum_after_oom"] == 5 * 100 * MiB


def test_oom_message_reserved_but_unallocated_is_correct(oom_result):
    # CUDA: "X is allocated by PyTorch, and Y is reserved by PyTorch but unallocated", with
    # Y = reserved - allocated. Here reserved == allocated == 200 MiB, so Y must be 0.
    msg = oom_result["oom"][2]
    assert "200.00 MiB is reserved by PyTorch but unallocated" not in msg


def test_oom_in_op_and_beyond_capacity(oom_result):
    r = oom_result
    assert r["op_oom"] is not None and "200.00 MiB" in r["op_oom"]
    assert r["huge_oom"] is not None and "1.00 GiB" in r["huge_oom"]


def test_allocation_succeeds_after_free(oom_result):
    r = oom_result
    assert r["c_sum"] == 3 * 100 * MiB
    assert r["b_sum"] == 5 * 100 * MiB


def test_cached_memory_released_on_demand(oom_result):
    r = oom_result
    assert r["reserved_cached"] == 200 * MiB  # b and c stay cached (large pool) after del
    assert r["e_last"] == 9  # 230 MiB fits only after the cache is released
    assert r["retries"] >= 1


def test_memory_fraction_limits_allocation(oom_result):
    r = oom_result
    assert r["fraction_oom"] is not None
    assert "100.00 MiB" in r["fraction_oom"]
    assert "fraction" in r["fraction_oom"]
    assert r["fraction_small_ok"] == 40 * MiB


# --------------------------------------------------------------------------- pinned host memory


def test_pin_memory_method():
    t = torch.arange(1000, dtype=torch.float32)
    assert t.is_pinned() is False
    p = t.pin_memory()
    assert p.is_pinned() is True
    assert p.device.type == "cpu"
    assert torch.equal(p, t)
    assert p.data_ptr() != t.data_ptr()


def test_empty_pin_memory_true():
    p = torch.empty(64, 3, pin_memory=True)
    assert p.is_pinned() is True
    p.copy_(torch.ones(64, 3))
    n = p.to("neuron", non_blocking=True)
    assert torch.equal(n.cpu(), torch.ones(64, 3))
    assert torch.zeros(4, pin_memory=True).is_pinned()
    assert torch.equal(torch.zeros(4, pin_memory=True), torch.zeros(4))


def test_pinned_non_blocking_roundtrip():
    src = torch.randn(256, 256).pin_memory()
    n = src.to("neuron", non_blocking=True)
    dst = torch.empty(256, 256, pin_memory=True)
    dst.copy_(n * 2, non_blocking=True)
    torch.neuron.synchronize()
    assert torch.equal(dst, src * 2)


def test_host_memory_stats_track_pinned_allocations():
    stats0 = torch.neuron.memory.host_memory_stats()
    p = torch.empty(1 << 16, dtype=torch.uint8, pin_memory=True)
    stats1 = torch.neuron.memory.host_memory_stats()
    assert stats1["allocations"] == stats0["allocations"] + 1
    assert stats1["allocated_bytes"] >= stats0["allocated_bytes"] + (1 << 16)
    del p
    stats2 = torch.neuron.memory.host_memory_stats()
    assert stats2["allocations"] == stats0["allocations"]


def test_neuron_tensor_rejects_pin_memory():
    with pytest.raises(RuntimeError, match="pin"):
        torch.empty(4, device="neuron", pin_memory=True)


def test_alloc_conf_memory_fraction_caps_the_process():
    code = (
        "import torch\n"
        "x = torch.empty(200 * 2**20, dtype=torch.uint8, device='neuron')\n"
        "try:\n"
        "    torch.empty(200 * 2**20, dtype=torch.uint8, device='neuron')\n"
        "    print('no oom')\n"
        "except torch.OutOfMemoryError as e:\n"
        "    print('oom', 'limited to 256.00 MiB by the memory fraction' in str(e))\n"
    )
    p = _run_with_env(code, TORCH_NEURONX_SIM_HBM="1GiB", TORCH_NEURONX_ALLOC_CONF="per_process_memory_fraction:0.25")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "oom True"
    p = _run_with_env(code, TORCH_NEURONX_SIM_HBM="1GiB")
    assert p.stdout.strip() == "no oom", p.stderr


def test_alloc_conf_garbage_collection_threshold_releases_idle_cache():
    code = (
        "import torch\n"
        "a = torch.empty(12 * 2**20, dtype=torch.uint8, device='neuron')\n"
        "b = torch.empty(12 * 2**20, dtype=torch.uint8, device='neuron')\n"
        "del a, b\n"
        "torch.neuron.synchronize()\n"
        "c = torch.empty(30 * 2**20, dtype=torch.uint8, device='neuron')\n"
        "print(torch.neuron.memory_reserved() // 2**20)\n"
    )
    with_gc = _run_with_env(code, TORCH_NEURONX_SIM_HBM="100MiB",
                            TORCH_NEURONX_ALLOC_CONF="garbage_collection_threshold:0.5")
    without = _run_with_env(code, TORCH_NEURONX_SIM_HBM="100MiB")
    assert with_gc.returncode == 0 and without.returncode == 0, with_gc.stderr + without.stderr
    assert int(without.stdout) == 54 and int(with_gc.stdout) == 42


@pytest.mark.parametrize("conf,message", [
    ("per_process_memory_fraction:2", "per_process_memory_fraction must be in (0, 1]"),
    ("max_split_size_mb:64", "unknown key 'max_split_size_mb'"),
    ("garbage_collection_threshold", "expected key:value pairs"),
])
def test_alloc_conf_errors_name_the_variable(conf, message):
    p = _run_with_env("import torch; torch.ones(1, device='neuron')", TORCH_NEURONX_ALLOC_CONF=conf)
    assert p.returncode != 0
    assert "TORCH_NEURONX_ALLOC_CONF" in p.stderr and message in p.stderr, p.stderr


# ---- memory history and snapshots (PyTorch's format, read by torch.cuda._memory_viz)

@pytest.fixture
def history():
    torch.neuron.memory._record_memory_history(stacks="python", max_entries=10_000, device=DEV,
                                               clear_history=True)
    yield
    torch.neuron.memory._record_memory_history(None, device=DEV)


def _allocate_weights_here():
    return torch.empty(3 * MiB // 4, dtype=torch.float32, device=f"neuron:{DEV}")


def _py_frames(frames):
    return [f["name"] for f in frames if f["filename"].endswith(".py")]


def test_memory_history_snapshot_has_stacks_and_trace(history):
    _clean()
    w = _allocate_weights_here()
    addr = w.data_ptr()
    snap = torch.neuron.memory._snapshot(DEV)
    assert set(snap) >= {"segments", "device_traces"}
    assert len(snap["device_traces"]) == torch.neuron.device_count()
    blocks = {b["address"]: b for s in snap["segments"] for b in s["blocks"]}
    live = blocks[addr]
    assert live["state"] == "active_allocated" and live["size"] == 3 * MiB
    assert live["requested_size"] == 3 * MiB
    assert "_allocate_weights_here" in _py_frames(live["frames"])
    seg = next(s for s in snap["segments"] if s["address"] <= addr < s["address"] + s["total_size"])
    assert seg["device"] == DEV and seg["segment_type"] == "large" and seg["allocated_size"] >= 3 * MiB
    trace = snap["device_traces"][DEV]
    allocs = [e for e in trace if e["action"] == "alloc" and e["addr"] == addr]
    assert allocs and allocs[-1]["size"] == 3 * MiB
    assert "_allocate_weights_here" in _py_frames(allocs[-1]["frames"])
    del w
    trace = torch.neuron.memory._snapshot(DEV)["device_traces"][DEV]
    actions = [e["action"] for e in trace if e.get("addr") == addr]
    assert actions[-2:] == ["free_requested", "free_completed"]
    assert [e["action"] for e in trace].count("snapshot") == 2


def test_memory_history_renders_with_pytorch_visualizer(history, tmp_path):
    from torch.cuda import _memory_viz

    _clean()
    keep = [_allocate_weights_here() for _ in range(3)]
    del keep[1]
    path = tmp_path / "snap.pickle"
    torch.neuron.memory._dump_snapshot(str(path))
    import pickle

    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert "<html>" in _memory_viz.trace_plot(snap) and "<html>" in _memory_viz.segment_plot(snap)
    summary = _memory_viz.segsum(snap)
    assert "segment" in summary.lower()
    # The visualizer's allocation replay accounts for every live block.
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert live >= 2 * 3 * MiB


def test_memory_history_records_out_of_memory(history):
    _clean()
    cap = torch.neuron.get_device_properties(DEV).total_memory
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(cap + MiB, dtype=torch.uint8, device=f"neuron:{DEV}")
    oom = [e for e in torch.neuron.memory._snapshot(DEV)["device_traces"][DEV] if e["action"] == "oom"]
    assert oom and oom[-1]["size"] == cap + MiB and oom[-1]["device_free"] <= cap


def test_memory_history_off_and_ring_size():
    torch.neuron.memory._record_memory_history(max_entries=4, device=DEV, clear_history=True)
    try:
        keep = [_allocate_weights_here() for _ in range(6)]
        trace = torch.neuron.memory._snapshot(DEV)["device_traces"][DEV]
        assert len(trace) == 4 and trace[-1]["action"] == "snapshot"
        del keep
    finally:
        torch.neuron.memory._record_memory_history(None, device=DEV)
    assert torch.neuron.memory._snapshot(DEV)["device_traces"][DEV] == []
    blocks = [b for s in torch.neuron.memory._snapshot(DEV)["segments"] for b in s["blocks"]]
    assert all(b["frames"] == [] for b in blocks)


@pytest.mark.parametrize("kwargs, message", [({"enabled": "yes"}, "enabled must be"),
                                             ({"context": "some"}, "context must be"),
                                             ({"stacks": "cpp"}, "stacks must be"),
                                             ({"max_entries": -1}, "max_entries must be")])
def test_memory_history_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        torch.neuron.memory._record_memory_history(device=DEV, **kwargs)


def test_kernels_host_scratch_is_reused_so_steps_take_no_fresh_pages():
    """ATen's CPU kernels on the engine threads allocate their results and temporaries (a compiled
    graph's library calls: convolution, batch norm, relu, their backward) from a cache
    (csrc/backend/kernel_scratch.cpp) instead of fresh mmaps: after warm-up a training step of
    ~20 MB of such results takes (almost) no page faults, where it took one per 4 KiB before."""
    import resource

    torch.manual_seed(0)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()).to("neuron")
    f = torch.compile(net, backend="neuron")
    x = torch.randn(16, 3, 64, 64, device="neuron")

    def step():
        f(x).square().mean().backward()
        torch.neuron.synchronize()

    for _ in range(2):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        step()
    per_step = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 5
    assert per_step < 500, per_step  # (without the cache: ~5,000)
    ref = copy.deepcopy(net).cpu()
    torch.testing.assert_close(f(x).cpu(), ref(x.cpu()), rtol=1e-4, atol=1e-4)


_SCRATCH_CAP_JOB = """
import json, torch, torch_neuronx
w = torch.randn(8, 8, 3, 3, device="neuron")
def conv(k):
    x = torch.randn(4, 8, 128 + 8 * k, 128, device="neuron")
    torch.nn.functional.conv2d(x, w, padding=1)
    torch.neuron.synchronize()
    return torch_neuronx.metrics()["kernel_scratch"]
seen = [conv(k) for k in range(12)]  # twelve shapes, ~3-4 MiB blocks each
again = conv(11)                     # the latest shape again
torch.neuron.empty_cache()
print(json.dumps({"seen": seen, "again": again, "emptied": torch_neuronx.metrics()["kernel_scratch"]}))
"""


def test_kernel_scratch_keeps_recent_sizes_within_its_cap():
    """Shapes that keep changing (dynamic sequence lengths) must not leave the scratch cache full of
    dead sizes: past the cap (TORCH_NEURONX_KERNEL_SCRATCH_BYTES, here 32 MiB) the blocks idle
    longest are freed, the latest shape's blocks are reused, and empty_cache() frees the rest."""
    import json

    cap = 32 << 20
    env = clean_env(TORCH_NEURONX_KERNEL_SCRATCH_BYTES=cap)
    out = subprocess.run([sys.executable, "-c", _SCRATCH_CAP_JOB], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(s["idle_bytes"] <= cap for s in r["seen"]), r["seen"]
    assert r["seen"][-1]["evicted_bytes"] > 0 and r["seen"][-1]["fresh"] >= 20, r["seen"][-1]
    assert r["again"]["reused"] > r["seen"][-1]["reused"] and r["again"]["fresh"] == r["seen"][-1]["fresh"], r
    assert r["emptied"]["idle_bytes"] == 0 and r["emptied"]["idle_blocks"] == 0, r["emptied"]
