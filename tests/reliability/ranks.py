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
