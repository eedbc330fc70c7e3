"""The soak's fast part (``soak.py``; ``make soak`` runs 10,000 steps eager and compiled and 2,000
under DDP): a few hundred nanoGPT training steps per mode, each in its own process so that RSS,
descriptors and threads are the program's own, and a planted leak that the check must find."""
import json
import os
import subprocess
import sys

SOAK = os.path.join(os.path.dirname(__file__), "soak.py")


def _soak(tmp_path, mode, steps, every, *extra, expect_ok=True):
    out = tmp_path / f"{mode}.json"
    r = subprocess.run([sys.executable, SOAK, "--mode", mode, "--steps", str(steps), "--every", str(every),
                        "--out", str(out), *extra], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TORCH_NEURONX_CACHE_DIR=str(tmp_path / "cache")))
    assert (r.returncode == 0) == expect_ok, f"soak exited {r.returncode}:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    if mode == "ddp":
        return [json.loads((tmp_path / f"{mode}.json.rank{k}").read_text()) for k in (0, 1)]
    return json.loads(out.read_text())


def _flat(report, steps, every):
    assert not report["failures"], report["failures"]
    assert len(report["samples"]) == steps // every and report["samples"][-1]["step"] == steps
    assert set(report["series"]) == {"allocated_mib", "reserved_mib", "rss_mib", "fds", "threads"}
    assert report["series"]["allocated_mib"]["last"] > 0  # the model lives on the device


def test_eager_training_is_flat_and_matches_cpu_bitwise(tmp_path):
    report = _soak(tmp_path, "eager", 600, 50)
    _flat(report, 600, 50)
    assert report["worst_loss_rel_diff"] == 0.0  # the same ATen kernels as the CPU reference


def test_compiled_training_is_flat_and_matches_cpu_eager(tmp_path):
    report = _soak(tmp_path, "compiled", 300, 50)
    _flat(report, 300, 50)
    assert report["worst_loss_rel_diff"] < 1e-5


def test_ddp_training_is_flat_on_every_rank(tmp_path):
    reports = _soak(tmp_path, "ddp", 200, 25)
    for r in reports:
        _flat(r, 200, 25)
        assert r["world"] == 2 and r["worst_loss_rel_diff"] == 0.0  # same DDP program over Gloo on CPU
    assert [r["rank"] for r in reports] == [0, 1]


def test_a_planted_leak_is_found(tmp_path):
    report = _soak(tmp_path, "eager", 300, 25, "--plant-leak", expect_ok=False)
    assert any(f.startswith("allocated_mib grows") for f in report["failures"]), report["failures"]
