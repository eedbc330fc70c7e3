"""The concurrency stress's fast part (``stress_threads.py``; ``make soak`` runs it for 3 minutes):
2 ranks x 8 threads for a few seconds, training with autograd and running collectives at once."""
import json
import os
import subprocess
import sys

STRESS = os.path.join(os.path.dirname(__file__), "stress_threads.py")


def test_eight_threads_per_rank_train_and_reduce_at_once_and_match_single_threaded_runs(tmp_path):
    out = tmp_path / "stress"
    r = subprocess.run([sys.executable, STRESS, "--seconds", "8", "--out", str(out)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    reports = [json.loads((tmp_path / f"stress.rank{k}").read_text()) for k in (0, 1)]
    for rep in reports:
        assert not rep["errors"], rep["errors"]
        trainers, reducers = rep["rounds"][:6], rep["rounds"][6:]
        # every thread did real work: rounds compared with the single-threaded references
        assert min(trainers) >= 2 and min(reducers) >= 10, rep["rounds"]
        assert rep["memory_after"] == rep["memory_before"]
    assert reports[0]["rounds"][6:] == reports[1]["rounds"][6:]  # collectives paired across ranks
