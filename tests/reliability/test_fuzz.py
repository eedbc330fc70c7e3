"""The fuzzers' fast parts (``fuzz_ops.py`` for eager ops, ``fuzz_compile.py`` for compiled graphs;
``make fuzz`` runs the long ones), and the eager cases they found, shrunk to regression tests (the
compiled one is in tests/test_compile.py)."""
import pytest
import torch

import torch_neuronx  # noqa: F401
import fuzz_ops

DEV = "neuron"


def test_fuzz_cases_match_cpu():
    s = fuzz_ops.run(seed=0, cases=4000)
    print(f"{s['cases']} cases ({s['cpu_raised']} where CPU raises) in {s['seconds']:.1f} s; {s['families']}")
    assert not s["failures"], "\n".join(f"{f['index']}: {f['case']}: {f['problem']}" for f in s["failures"][:20])
    # The mechanism ran: every family, invalid input that CPU rejects, large and 0-size shapes.
    assert min(s["families"].values()) > 300 and s["cpu_raised"] > 400
    words = " ".join(fuzz_ops.make_case(0, i).words for i in range(4000))
    for seen in ("[0", "300001", "transposed", "expanded", "permuted", "offset", "cpu-scalar", "[invalid]"):
        assert seen in words, seen


def test_fuzzer_reports_a_wrong_result_an_error_and_a_missing_error(monkeypatch):
    """A divergence planted on the neuron side is found, whichever kind it is."""
    case = fuzz_ops.Case("binary", torch.add, [fuzz_ops.T(torch.ones(3), lambda t: t, "x"),
                                               fuzz_ops.T(torch.ones(3), lambda t: t, "y")], "add")
    monkeypatch.setattr(fuzz_ops, "make_case", lambda seed, i: case)
    real_run = fuzz_ops._run

    def wrong(c, device):
        out, err = real_run(c, device)
        return ([out[0] + (device != "cpu")], err) if out else (out, err)

    monkeypatch.setattr(fuzz_ops, "_run", wrong)
    assert "not close" in fuzz_ops.run(0, 1)["failures"][0]["problem"]
    monkeypatch.setattr(fuzz_ops, "_run", lambda c, d: (None, IndexError("x")) if d != "cpu" else real_run(c, d))
    assert "neuron raised IndexError" in fuzz_ops.run(0, 1)["failures"][0]["problem"]
    monkeypatch.setattr(fuzz_ops, "_run", lambda c, d: (None, ValueError("x")) if d == "cpu" else real_run(c, d))
    assert "neuron did not" in fuzz_ops.run(0, 1)["failures"][0]["problem"]


# Found by the fuzzer (seed 1 case 15369; seed 2 case 10339, seed 5 case 10905).

def test_copy_between_shapes_that_do_not_broadcast_raises_at_the_call_even_when_empty():
    for dst_shape, src_shape in (((5, 8, 0), (6, 8, 0)), ((5, 8), (6, 8)), ((8,), (2, 8))):
        dst, src = torch.empty(dst_shape, device=DEV), torch.empty(src_shape, device=DEV)
        with pytest.raises(RuntimeError) as cpu:
            torch.empty(dst_shape).copy_(torch.empty(src_shape))
        with pytest.raises(RuntimeError) as neuron:  # at the call, as on CPU and CUDA: no synchronize
            dst.copy_(src)
        assert str(neuron.value).split("\n")[0] == str(cpu.value).split("\n")[0]
        with pytest.raises(RuntimeError, match="must match|broadcast shape"):
            dst.copy_(src.cpu())  # host -> device checks the same
    torch.neuron.synchronize()  # nothing was queued that fails later


def test_a_result_dtype_the_meta_kernel_gets_wrong_is_cpus_for_every_shape():
    # pow(bool, True) is bool on CPU; its meta kernel says int64.
    for shape in ((5, 3), (3, 1, 8, 33), (7,), (5, 3)):
        x = torch.rand(shape) < 0.5
        got = torch.pow(x.to(DEV), True)
        assert got.dtype == torch.bool and torch.equal(got.cpu(), torch.pow(x, True))


def test_compiled_random_graphs_match_cpu_eager(tmp_path, monkeypatch):
    import fuzz_compile

    monkeypatch.setenv("TORCH_NEURONX_CACHE_DIR", str(tmp_path))
    s = fuzz_compile.run(seed=0, graphs=12)
    assert not s["failures"], "\n".join(f"{f['index']}: {f['graph']}: {f['problem']}" for f in s["failures"])
    assert s["graphs"] == 12


def test_random_collectives_across_three_ranks_match_the_expected_values(tmp_path):
    import json
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "fuzz_collectives.py")
    out = tmp_path / "coll"
    r = subprocess.run([sys.executable, script, "--world", "3", "--cases", "150", "--seed", "0", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    reports = [json.loads((tmp_path / f"coll.rank{k}").read_text()) for k in range(3)]
    assert r.returncode == 0, "\n".join(f"{f['index']}: {f['case']}: {f['problem']}" for rep in reports
                                        for f in rep["failures"][:10]) or r.stderr[-3000:]
    # The mechanism ran: every rank the same cases, invalid ones among them raised on every rank.
    assert {rep["cases"] for rep in reports} == {150} and len({rep["raised"] for rep in reports}) == 1
    assert reports[0]["raised"] >= 5


def test_a_root_rank_outside_the_group_raises_at_the_call():
    # Found by the collective fuzzer (seed 0): Gloo's own check ran on the collective queue, so
    # the error surfaced at the next synchronization, with a C++ backtrace.
    import torch.distributed as dist
    store = dist.HashStore()
    dist.init_process_group("neuron", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(4, device=DEV)
        for call in (lambda: dist.broadcast(t, src=1), lambda: dist.reduce(t, dst=3)):
            with pytest.raises(RuntimeError, match="invalid root rank"):
                call()
        dist.all_reduce(t)  # the group is fine
        assert torch.equal(t.cpu(), torch.ones(4))
    finally:
        dist.destroy_process_group()
