"""neuron-ls and neuron-top, run as a user runs them (console scripts, other processes; and
neuron-top in a tmux pane beside a training process), and the shared-memory counters they read."""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import clean_env

BIN = os.path.dirname(sys.executable)
MiB = 1 << 20

HOLDER = textwrap.dedent("""
    import sys, torch
    x = torch.empty(64 << 20, dtype=torch.uint8, device="neuron:1")
    torch.neuron.synchronize(1)
    print("ready", flush=True)
    sys.stdin.readline()
""")

TRAINER = textwrap.dedent("""
    import sys, time, torch
    m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to("neuron")
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x = torch.randn(64, 256, device="neuron")
    print("ready", flush=True)
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        loss = m(x).square().mean(); loss.backward(); opt.step(); opt.zero_grad(); loss.item()
""")


def _env():
    return clean_env()


def _start(code, *args):
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=_env())
    assert p.stdout.readline().strip() == "ready"
    return p


def _tool(name, *args):
    r = subprocess.run([os.path.join(BIN, name), *args], capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    return r.stdout


def _segment(pid):
    return f"/dev/shm/torch_neuronx.{pid}"


def test_neuron_ls_lists_cores_and_the_process_holding_memory():
    holder = _start(HOLDER)
    try:
        info = json.loads(_tool("neuron-ls", "--json"))
        assert info["simulated"] and len(info["cores"]) >= 2
        core1 = next(c for c in info["cores"] if c["core"] == 1)
        (proc,) = [p for p in core1["processes"] if p["pid"] == holder.pid]
        assert proc["device"] == "neuron:1" and proc["allocated"] == 64 * MiB
        assert proc["reserved"] >= 64 * MiB and "-c" in proc["command"]
        assert core1["capacity"] > 0 and core1["allocated"] >= 64 * MiB
        assert holder.pid not in [p["pid"] for c in info["cores"] if c["core"] == 0 for p in c["processes"]]
        text = _tool("neuron-ls")
        assert "NeuronCore(s) (simulated)" in text and str(holder.pid) in text
        assert oct(os.stat(_segment(holder.pid)).st_mode & 0o777) == "0o600"
    finally:
        holder.communicate("\n", timeout=60)
    # A process that exits removes its counters.
    assert not os.path.exists(_segment(holder.pid))
    info = json.loads(_tool("neuron-ls", "--json"))
    assert holder.pid not in [p["pid"] for c in info["cores"] for p in c["processes"]]


def test_segment_of_a_killed_process_is_cleaned_by_the_tools():
    holder = _start(HOLDER)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert os.path.exists(_segment(holder.pid))  # SIGKILL: no exit handlers ran
    info = json.loads(_tool("neuron-ls", "--json"))
    assert holder.pid not in [p["pid"] for c in info["cores"] for p in c["processes"]]
    assert not os.path.exists(_segment(holder.pid))


def _start_with_segment(plant):
    """HOLDER started after plant(path) put something at its segment's name (the pid is known
    before the interpreter starts: sh waits for a line, then execs it in place)."""
    p = subprocess.Popen(["sh", "-c", 'read x; exec "$0" -c "$1"', sys.executable, HOLDER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=_env())
    plant(_segment(p.pid))
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "ready"
    return p


def _listed(pid):
    return pid in [p["pid"] for c in json.loads(_tool("neuron-ls", "--json"))["cores"] for p in c["processes"]]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a segment owned by another user needs root")
def test_a_segment_another_user_made_under_our_name_is_left_alone():
    planted = b"not ours" * 64

    def plant(path):
        with open(path, "wb") as f:
            f.write(planted)
        os.chmod(path, 0o666)
        os.chown(path, 65534, 65534)

    holder = _start_with_segment(plant)
    path = _segment(holder.pid)
    try:
        # The process ran (its device works) and published nothing into the other user's file.
        with open(path, "rb") as f:
            assert f.read() == planted
        assert os.stat(path).st_uid == 65534 and not _listed(holder.pid)
    finally:
        holder.communicate("\n", timeout=60)
        os.unlink(path)
    assert holder.returncode == 0


def test_a_stale_segment_of_our_own_under_our_name_is_replaced():
    def plant(path):
        with open(path, "wb") as f:
            f.write(b"stale" * 100)
        os.chmod(path, 0o644)

    holder = _start_with_segment(plant)
    try:
        assert stat.S_IMODE(os.stat(_segment(holder.pid)).st_mode) == 0o600 and _listed(holder.pid)
    finally:
        holder.communicate("\n", timeout=60)
    assert not os.path.exists(_segment(holder.pid))


@pytest.mark.skipif(os.geteuid() != 0, reason="making a segment owned by another user needs root")
def test_tools_read_a_segment_only_if_the_process_user_made_it():
    from torch_neuronx.tools import telemetry

    holder = _start(HOLDER)
    other = subprocess.Popen(["sleep", "120"])
    fake = _segment(other.pid)
    try:
        # A well-formed segment naming `other`, as anyone could write it.
        data = bytearray(open(_segment(holder.pid), "rb").read())
        data[16:24] = other.pid.to_bytes(8, "little", signed=True)
        with open(fake, "wb") as f:
            f.write(data)
        assert other.pid in [s.pid for s in telemetry.read_processes(clean_stale=False)]
        os.chown(fake, 65534, 65534)
        assert other.pid not in [s.pid for s in telemetry.read_processes(clean_stale=False)]
    finally:
        other.kill()
        other.wait(timeout=60)
        holder.communicate("\n", timeout=60)
        if os.path.exists(fake):
            os.unlink(fake)


def test_neuron_top_json_reports_throughput_of_a_training_process():
    trainer = _start(TRAINER, "20")
    try:
        sample = json.loads(_tool("neuron-top", "--json", "--interval", "1"))
    finally:
        trainer.kill()
        trainer.wait(timeout=60)
    (row,) = [p for p in sample["processes"] if p["pid"] == trainer.pid]
    assert row["device"] == "neuron:0" and row["kernels"] > 0 and row["kernels_per_s"] > 10
    assert 0 < row["busy"] <= 1 and row["allocated"] > 0
    core0 = next(c for c in sample["cores"] if c["core"] == 0)
    assert core0["kernels_per_s"] >= row["kernels_per_s"]


def test_neuron_top_rejects_bad_interval():
    r = subprocess.run([os.path.join(BIN, "neuron-top"), "--interval", "0"], capture_output=True, text=True,
                       timeout=60, env=_env())
    assert r.returncode == 2 and "--interval must be positive" in r.stderr


def _row(pane, pid):
    for line in pane.splitlines():
        f = line.split()
        if f and f[0] == str(pid):
            return f
    return None


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (make installs it)")
def test_neuron_top_in_tmux_beside_training():
    trainer = _start(TRAINER, "30")
    session = f"neuron-top-test-{os.getpid()}"
    env = _env()
    try:
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "220", "-y", "40",
                        f"{os.path.join(BIN, 'neuron-top')} --interval 0.5"], check=True, env=env)
        rows = []
        deadline = time.time() + 60
        while time.time() < deadline and len(rows) < 2:
            time.sleep(1.0)
            pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                                  env=env).stdout
            row = _row(pane, trainer.pid)
            if row and (not rows or row != rows[-1]):
                rows.append(row)
        assert len(rows) >= 2, f"neuron-top never showed pid {trainer.pid}:\n{pane}"
        assert "neuron-top" in pane and "KERNELS/S" in pane
        # PID DEVICE CORE ALLOCATED(2) RESERVED(2) PEAK(2) QUEUED KERNELS KERNELS/S BUSY COMMAND
        first, second = rows[0], rows[-1]
        assert first[1] == "neuron:0"
        kernels = [int(r[10]) for r in (first, second)]
        assert kernels[1] > kernels[0] > 0, (first, second)  # the numbers move
        assert float(second[11]) > 0
        assert re.fullmatch(r"\d+%", second[12])
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], env=env)
        for _ in range(50):
            if subprocess.run(["tmux", "has-session", "-t", session], capture_output=True, env=env).returncode:
                break
            time.sleep(0.1)
        else:
            pytest.fail("neuron-top did not quit on q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, env=env)
        trainer.kill()
        trainer.wait(timeout=60)
