"""Injected faults that need a process of their own (docs/reliability.md lists every fault and where
it is tested): out of memory in the middle of training, then recovery."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import clean_env  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "oom_job.py")


def test_out_of_memory_mid_step_then_training_continues_exactly():
    r = subprocess.run([sys.executable, JOB], capture_output=True, text=True, timeout=300,
                       env=clean_env(TORCH_NEURONX_SIM_HBM="256MiB"))
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["capacity_mib"] == 256
    # Both faults happened, as OutOfMemoryError with the allocator's message.
    assert res["forward_oom"] and "Tried to allocate" in res["forward_oom"], res
    assert res["backward_oom"] and "Tried to allocate 1.00 GiB" in res["backward_oom"], res
    assert res["grads_present_after_backward_oom"] > 0  # the backward was under way
    assert res["num_ooms"] == 2
    # Training went on as if the failed steps had never been tried, and nothing leaked.
    assert len(res["losses"]) == 10 and res["losses"] == res["ref_losses"]
    assert res["allocated_after_mib"] == res["allocated_before_mib"]


# Queues ~N matmuls of 1024x1024 whose result is known without computing it (x @ I + 1, N times,
# is x + N exactly), then waits in torch.neuron.synchronize(); the test sends SIGINT.
_LONG_QUEUE = r"""
import sys, time, torch, torch_neuronx
eye = torch.eye(1024, device="neuron")
x0 = torch.randint(0, 100, (1024, 1024)).float()
a = x0.to("neuron")
t0 = time.perf_counter()
torch.neuron.synchronize(); (a @ eye).cpu()
per = time.perf_counter() - t0
n = max(20, int(8.0 / per))
for _ in range(n):
    a = a @ eye + 1
print(f"queued {n} {n * per:.2f}", flush=True)
t0 = time.perf_counter()
try:
    torch.neuron.synchronize()
    print("not interrupted", flush=True)
except KeyboardInterrupt:
    print(f"interrupted {time.perf_counter() - t0:.2f}", flush=True)
    if sys.argv[1] == "leave":
        raise
    torch.neuron.synchronize()  # the queue went on: the result is whole
    print("result", bool(torch.equal(a.cpu(), x0 + n)), flush=True)
"""


def _interrupt_long_queue(mode):
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", _LONG_QUEUE, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=clean_env())
    queued = p.stdout.readline().split()
    assert queued and queued[0] == "queued", p.communicate(timeout=60)
    expected_s = float(queued[2])
    time.sleep(0.5)
    sent = time.perf_counter()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return expected_s, time.perf_counter() - sent, p.returncode, out, err


def test_ctrl_c_in_synchronize_raises_at_once_and_leaving_drops_the_queue():
    expected_s, exit_s, rc, out, err = _interrupt_long_queue("leave")
    assert expected_s >= 5, expected_s  # the queue holds seconds of work
    assert out.startswith("interrupted"), (out, err[-2000:])
    assert float(out.split()[1]) < 0.5 + 1.0  # raised within a wait slice of the signal, not at the end
    # KeyboardInterrupt ends the program as usual (Python re-raises SIGINT); the kernels not yet
    # started were dropped: the exit does not wait for the rest of the queue.
    assert rc == -2 and "KeyboardInterrupt" in err and "terminate called" not in err, (rc, err[-2000:])
    assert exit_s < min(3.0, expected_s / 2), (exit_s, expected_s)


def test_ctrl_c_caught_leaves_the_queue_running_and_its_results_whole():
    expected_s, exit_s, rc, out, err = _interrupt_long_queue("stay")
    assert rc == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[0].startswith("interrupted") and lines[1] == "result True", out
