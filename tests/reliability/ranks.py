"""Starting a script of tests/reliability in several ranks on this host (plain processes, so that
each checks its own part and a failing rank does not take the launcher down)."""
import os
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, argv, world=2, env_per_rank=lambda r: {}):
    """Run `script argv` as ranks 0..world-1 (RANK, WORLD_SIZE, MASTER_ADDR/PORT set); their exit codes."""
    port, procs = free_port(), []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), **env_per_rank(r))
        procs.append(subprocess.Popen([sys.executable, script, *argv], env=env))
    return [p.wait() for p in procs]


def join_group(timeout_s):
    """In a rank started by launch(): make its device current and join the `neuron` group.
    Returns (rank, world size, device)."""
    import datetime

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("neuron", rank % torch.neuron.device_count())
    torch.neuron.set_device(dev)
    dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=timeout_s), device_id=dev)
    return rank, world, dev


def finish(report, out, summary, problems):
    """Write this rank's report to OUT.rank<r> (if `out`), print the summary and the first problems,
    leave the group and exit: 1 if there were problems."""
    import json

    import torch.distributed as dist

    rank = report["rank"]
    if out:
        with open(f"{out}.rank{rank}", "w") as f:
            json.dump(report, f)
    print(f"[rank {rank}] {summary}", flush=True)
    for p in problems[:20]:
        print(f"[rank {rank}] {p}", flush=True)
    dist.destroy_process_group()
    raise SystemExit(1 if problems else 0)
