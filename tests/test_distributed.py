"""torch.distributed with backend="neuron": every collective against Gloo on CPU, and the
training stack (DDP, FSDP2, tensor and pipeline parallel, ZeRO, DTensor, distributed
checkpoint) on neuron against the same job on CPU, rank by rank; failures (a dead peer, a
mismatched collective); torchrun launch; two ranks in two network namespaces."""
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import clean_env

JOBS = os.path.join(os.path.dirname(__file__), "distributed", "jobs.py")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra):
    return clean_env(**extra)


def launch(job, tmp_path, nprocs=2, timeout=300, expect_ok=True, **env):
    """Run `job` in `nprocs` ranks (plain processes, so one rank may die without the launcher
    killing the others); return (per-rank results, per-rank (returncode, output))."""
    port = _free_port()
    procs = []
    for r in range(nprocs):
        e = _env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=nprocs, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env)
        procs.append(subprocess.Popen([sys.executable, JOBS, job, str(tmp_path)], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{job} hung:\n" + "\n".join(q.communicate()[0][-3000:] for q in procs))
        outs.append((p.returncode, out))
    if expect_ok:
        for r, (rc, out) in enumerate(outs):
            assert rc == 0, f"{job} rank {r} exited {rc}:\n{out[-6000:]}"
    results = []
    for r in range(nprocs):
        path = tmp_path / f"{job}.rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else None)
    return results, outs


def test_every_collective_matches_gloo(tmp_path):
    results, outs = launch("collectives", tmp_path)
    assert all(r["checked"] >= 8 * 3 * 20 for r in results)
    # A group with a backend per device ("cpu:gloo,neuron:neuron") has a default backend, so
    # destroy_process_group asks it for hooks instead of warning (torch_neuronx._torch_compat).
    for _, out in outs:
        assert "No backend of type" not in out, out[-3000:]


@pytest.mark.parametrize("peer_access", ["1", "0"])
def test_every_collective_under_inference_mode(tmp_path, peer_access):
    results, _ = launch("inference_mode", tmp_path, TORCH_NEURONX_DIST_PEER_ACCESS=peer_access)
    assert all(r["checked"] >= 40 for r in results)


def test_every_collective_at_64mb_matches_gloo(tmp_path):
    results, _ = launch("collectives_64mb", tmp_path)
    assert all(r["checked"] >= 5 * 20 for r in results)


def test_transport_with_one_connection_and_three_connections(tmp_path):
    # The default is two connections per peer; the setting changes how collectives are spread,
    # never their results. Peer access off: every collective's data goes through Gloo, as
    # between hosts.
    for conns, threads in ((1, 1), (3, 2)):
        results, _ = launch("collectives", tmp_path, TORCH_NEURONX_DIST_CONNECTIONS=conns,
                            TORCH_NEURONX_DIST_THREADS=threads, TORCH_NEURONX_DIST_PEER_ACCESS=0)
        assert all(r["checked"] >= 8 * 3 * 20 for r in results)


@pytest.mark.parametrize("value", ["0", "-2", "two", ""])
def test_bad_transport_setting_is_a_clear_error(monkeypatch, value):
    from torch_neuronx import distributed as nd
    monkeypatch.setenv("TORCH_NEURONX_DIST_CONNECTIONS", value)
    with pytest.raises(ValueError, match="TORCH_NEURONX_DIST_CONNECTIONS=.*expected a positive integer"):
        nd._env_count("TORCH_NEURONX_DIST_CONNECTIONS", nd.DEFAULT_CONNECTIONS)
    monkeypatch.delenv("TORCH_NEURONX_DIST_CONNECTIONS")
    assert nd._env_count("TORCH_NEURONX_DIST_CONNECTIONS", nd.DEFAULT_CONNECTIONS) == 2


@pytest.mark.parametrize("nprocs", [2, 3])
@pytest.mark.parametrize("peer_access", ["1", "0"])
def test_direct_algorithms_against_known_values(tmp_path, nprocs, peer_access):
    # Peer access (one host, the default): each rank reduces its part read from its peers'
    # memory and writes it into theirs. Off, over Gloo: 2 ranks, the one-step exchange (up to
    # 1 MB); 3, the reduce-scatter and allgather.
    results, _ = launch("direct_algorithms", tmp_path, nprocs=nprocs, TORCH_NEURONX_DIST_PEER_ACCESS=peer_access)
    assert all(r["checked"] >= 62 for r in results), results
    assert all(r["peer_access"] is (peer_access == "1") for r in results), results


def test_bad_peer_access_setting_on_one_rank_raises_on_every_rank(tmp_path):
    results, _ = launch("bad_peer_setting_on_one_rank", tmp_path, JOB_TIMEOUT_S=60)
    assert "TORCH_NEURONX_DIST_PEER_ACCESS=maybe: expected 1" in results[1]["message"], results
    assert "rank 1 of this group has a bad TORCH_NEURONX_DIST_PEER_ACCESS" in results[0]["message"], results
    assert all(r["raised"] == "ValueError" and r["after_s"] < 10 for r in results), results


def test_bad_peer_access_setting_is_a_clear_error(tmp_path):
    _, outs = launch("launch_info", tmp_path, expect_ok=False, TORCH_NEURONX_DIST_PEER_ACCESS="yes")
    for rc, out in outs:
        assert rc != 0 and "TORCH_NEURONX_DIST_PEER_ACCESS=yes: expected 1" in out, out[-3000:]


def test_ddp_matches_cpu(tmp_path):
    results, outs = launch("ddp", tmp_path)
    for r in results:
        timers = {k: r.pop(k) for k in [k for k in r if k.startswith("timer ")]}
        assert set(r) == {"find_unused=False", "find_unused=True"}
        # every step's gradients: the MLP's 6 parameters (the unused layer has none)
        assert all(v["steps"] == 10 and v["grads"] == 10 * 6 for v in r.values())
        # DDP's runtime statistics are collected on neuron (device time from our timer)
        assert len(timers) == 2 and all(t[k] and t[k] > 0 for t in timers.values() for k in t), timers
    for r, (_, out) in enumerate(outs):  # and DDP has nothing to warn about for this device
        assert "Time stats are currently only collected" not in out, out[-2000:]
        assert re.fullmatch(rf"rank {r}: ddp ok \(peer access (True|False)\)", out.strip()), out[-3000:]  # nothing else


def test_fsdp2_matches_cpu(tmp_path):
    results, _ = launch("fsdp2", tmp_path)
    for r in results:
        assert set(r) == {"default", "bf16_params_fp32_reduce", "no_reshard_after_forward", "cpu_offload"}
        assert all(v["steps"] == 10 and v["params"] == 6 and v["grads"] == 10 * 6 for v in r.values())


def test_tensor_parallel_matches_cpu(tmp_path):
    results, _ = launch("tensor_parallel", tmp_path)
    assert all(r["block"]["steps"] == 10 and r["block"]["grads"] == 10 * r["block"]["params"] for r in results)


def test_pipeline_parallel_matches_cpu(tmp_path):
    results, _ = launch("pipeline_parallel", tmp_path)
    for r in results:
        assert set(r) == {"ScheduleGPipe", "Schedule1F1B"}
        assert all(v["steps"] == 10 and v["grads"] == 10 * v["params"] for v in r.values())


def test_zero_redundancy_optimizer_matches_cpu(tmp_path):
    results, _ = launch("zero", tmp_path)
    assert all(r["zero"]["steps"] == 10 and r["zero"]["grads"] == 10 * r["zero"]["params"] for r in results)


def test_dtensor_1d_and_2d_meshes(tmp_path):
    results, _ = launch("dtensor", tmp_path, nprocs=4, TORCH_NEURONX_SIM_CORES=4)
    assert all(r["checked"] >= 20 for r in results)


def test_dtensor_random_ops_shard_the_unsharded_values(tmp_path):
    results, _ = launch("dtensor_random", tmp_path, nprocs=2)
    assert all(r["checked"] == 25 for r in results)


def test_distributed_checkpoint_reloads_with_another_world_size(tmp_path):
    saved, _ = launch("dcp_save", tmp_path, nprocs=2)
    loaded, _ = launch("dcp_load", tmp_path, nprocs=1)
    assert loaded[0]["tensors"] == saved[0]["tensors"] == 6 and loaded[0]["world"] == 1


def test_dead_peer_raises_on_the_survivor_within_the_timeout(tmp_path):
    results, outs = launch("peer_dies", tmp_path, expect_ok=False, JOB_TIMEOUT_S=20)
    assert outs[1][0] == 17
    assert outs[0][0] == 0, outs[0][1][-3000:]
    r = results[0]
    assert r["raised"] in ("RuntimeError", "DistBackendError") and "c10d::allreduce failed" in r["message"]
    assert r["after_s"] < 20


@pytest.mark.parametrize("fault", ["kill", "stall"])
@pytest.mark.parametrize("job", ["ddp_peer_fault", "fsdp2_peer_fault"])
def test_a_rank_killed_or_stalled_in_a_training_step_makes_its_peer_raise_and_the_device_stays_usable(
        tmp_path, job, fault):
    timeout = 20 if fault == "kill" else 5
    results, outs = launch(job, tmp_path, expect_ok=False, JOB_TIMEOUT_S=timeout, PEER_FAULT=fault)
    assert outs[1][0] == (-signal.SIGKILL if fault == "kill" else 0), outs[1][1][-3000:]
    assert outs[0][0] == 0, outs[0][1][-3000:]
    r = results[0]
    assert r["raised"] in ("RuntimeError", "DistBackendError"), r
    if fault == "kill":
        assert r["after_s"] < timeout, r  # a dead peer is noticed at once, not at the timeout
    else:
        assert timeout - 1 <= r["after_s"] < timeout + 10, r  # a stalled one at the group's timeout
    assert r["probe"] == [0.0, 2.0, 4.0, 6.0]


def test_stalled_peer_makes_every_other_rank_raise_at_the_timeout(tmp_path):
    results, outs = launch("peer_stalls", tmp_path, nprocs=3, JOB_TIMEOUT_S=5)
    for r in results[:2]:
        assert r["raised"] in ("RuntimeError", "DistBackendError") and "c10d::allreduce failed" in r["message"], r
        assert 4 <= r["after_s"] < 15, r


def test_mismatched_sizes_raise_on_every_rank(tmp_path):
    results, _ = launch("mismatch", tmp_path)
    for r in results:
        m = r["all_reduce"]["message"]
        assert "collective mismatch" in m
        assert "rank 0: ALLREDUCE of 10 Float" in m and "rank 1: ALLREDUCE of 20 Float" in m
        for name in ("all_to_all_single", "all_to_all"):
            assert "all_to_all split mismatch" in r[name]["message"], r[name]


def test_transfers_and_barriers_are_ordered_after_collectives(tmp_path):
    results, _ = launch("ordering", tmp_path)
    for r in results:
        assert r["checked"] == 5
        assert "BFloat16" in r["errors"][0] and "Float" in r["errors"][0]
        assert "world size (2)" in r["errors"][1]


def test_transfer_wait_timeout_covers_the_wait_to_be_issued(tmp_path):
    results, _ = launch("transfer_wait_timeout", tmp_path)
    r = results[0]
    assert r["raised"] in ("RuntimeError", "DistBackendError"), r
    assert "500 ms passed to wait()" in r["message"] and "waiting to be issued" in r["message"], r["message"]
    assert r["after_s"] < 3, r  # the peer joins after 4 s


def test_wait_orders_the_stream_instead_of_blocking_the_host(tmp_path):
    results, _ = launch("streams", tmp_path)
    r = results[0]  # rank 0 waits for rank 1, which joins 1.5 s late
    assert r["wait_s"] < 0.5 and not r["completed_at_wait"], r
    assert r["until_data_s"] > 1.0, r


def test_exit_with_a_destroyed_subgroup_and_a_live_parent(tmp_path):
    results, outs = launch("subgroup_at_exit", tmp_path, timeout=120)
    assert [r["sum"] for r in results] == [[2.0] * 4] * 2


def test_torchrun_gives_each_rank_its_device(tmp_path):
    # No set_device in the job: LOCAL_RANK makes neuron:{LOCAL_RANK} current, and
    # init_process_group(device_id=...) without a backend picks neuron's.
    port = _free_port()
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        f"--master-port={port}", JOBS, "launch_info", str(tmp_path)],
                       env=_env(LAUNCH_INIT="device_id"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    infos = [json.loads((tmp_path / f"launch_info.rank{i}.json").read_text()) for i in range(2)]
    for i, info in enumerate(infos):
        assert info["local_rank"] == i and info["current_device"] == i and info["backend"] == "neuron"
        assert info["sum"] == [2.0, 2.0]
        assert info["peer_access"] is True  # one host


def test_visible_cores_per_process(tmp_path):
    """accelerate-style launch: each process sees one core (NEURON_RT_VISIBLE_CORES) as neuron:0."""
    port = _free_port()
    procs = []
    for r in range(2):
        e = _env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                 NEURON_RT_VISIBLE_CORES=r)
        procs.append(subprocess.Popen([sys.executable, JOBS, "launch_info", str(tmp_path)], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out[-3000:]
    infos = [json.loads((tmp_path / f"launch_info.rank{i}.json").read_text()) for i in range(2)]
    for i, info in enumerate(infos):
        assert info["device_count"] == 1 and info["current_device"] == 0 and info["physical_core"] == i
        assert info["sum"] == [2.0, 2.0]


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: (namespace, address, interface) per host."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    tag = f"nx{os.getpid() % 100000}"
    hosts = [(f"{tag}a", "10.231.7.1", f"{tag}x"), (f"{tag}b", "10.231.7.2", f"{tag}y")]
    if _ip("netns", "add", hosts[0][0]).returncode != 0:
        pytest.skip("cannot create network namespaces here (needs CAP_SYS_ADMIN)")
    try:
        steps = [("netns", "add", hosts[1][0]),
                 ("link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2])]
        for ns, addr, dev in hosts:
            steps += [("link", "set", dev, "netns", ns), ("-n", ns, "addr", "add", f"{addr}/24", "dev", dev),
                      ("-n", ns, "link", "set", dev, "up"), ("-n", ns, "link", "set", "lo", "up")]
        for s in steps:
            r = _ip(*s)
            assert r.returncode == 0, f"ip {' '.join(s)}: {r.stderr}"
        yield hosts
    finally:
        for ns, _, _ in hosts:
            _ip("netns", "del", ns)


def test_two_hosts_in_network_namespaces(tmp_path, two_hosts):
    """Each rank on its own 'host' (namespace, own address, own neuron:0), rendezvous on the
    first host's address, Gloo over the veth link: the DDP job matches CPU there too."""
    master = two_hosts[0][1]
    port = _free_port()
    procs = []
    for r, (ns, addr, dev) in enumerate(two_hosts):
        env = _env(RANK=r, LOCAL_RANK=0, WORLD_SIZE=2, MASTER_ADDR=master, MASTER_PORT=port,
                   GLOO_SOCKET_IFNAME=dev)
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, JOBS, "ddp", str(tmp_path)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for r, p in enumerate(procs):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, f"host {r}:\n{out[-4000:]}"
        assert "ddp ok (peer access False)" in out, out[-4000:]  # two hosts: every byte over Gloo
    for r in range(2):
        res = json.loads((tmp_path / f"ddp.rank{r}.json").read_text())
        assert res["find_unused=True"]["steps"] == 10
