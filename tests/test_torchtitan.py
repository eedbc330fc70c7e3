"""TorchTitan 0.2.2 on neuron, unchanged (issue 28 §2): its trainer (`torchtitan.train`, launched
with torchrun) trains the Llama 3, DeepSeek-V3 and GPT-OSS debug models on `neuron`, on 1 and 2
ranks (DDP, FSDP2, TP, PP, activation checkpointing, float8, compile, a DCP checkpoint save and
resume), and
the losses are compared with the same runs on CPU/Gloo. Assets (tokenizer, data) are generated.

TorchTitan has no CPU mode; the CPU reference runs go through tests/ecosystem/torchtitan_run.py,
which points PyTorch's device lookup at CPU (the neuron runs use TorchTitan's own lookup)."""
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
from helpers import clean_env

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "ecosystem", "torchtitan_run.py")
sys.path.insert(0, os.path.join(HERE, "ecosystem"))
from torchtitan_assets import make_assets  # noqa: E402

# `make ecosystem` runs the same comparisons for longer (TORCHTITAN_STEPS=20).
STEPS = int(os.environ.get("TORCHTITAN_STEPS", "4"))
assert STEPS >= 4 and STEPS % 2 == 0, "TORCHTITAN_STEPS: an even number, at least 4"
STEP = re.compile(r"step:\s*(\d+)\s+(?:\x1b\[[0-9;]*m)?loss:\s*([0-9.]+)")


def test_pinned_version():
    from importlib.metadata import version

    assert version("torchtitan") == "0.2.2"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(str(tmp_path_factory.mktemp("torchtitan-assets")))


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def titan(device, assets, dump, *args, nproc=1, model="llama3", steps=STEPS, onednn=True):
    """Runs TorchTitan's trainer; returns the loss of every step (equal on every rank). onednn=False:
    without oneDNN (torchtitan_run.py: CPU's float8 matmul on AMX hosts)."""
    tokenizer, data = assets
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
           str(_port()), RUN, device, "--model.name", model, "--model.flavor", "debugmodel",
           "--model.hf_assets_path", tokenizer, "--training.dataset", "c4_test", "--training.dataset_path", data,
           "--training.local_batch_size", "2", "--training.seq_len", "128", "--training.steps", str(steps),
           "--metrics.log_freq", "1", "--debug.seed", "42", "--job.dump_folder", str(dump), *args]
    env = clean_env(TORCH_NEURONX_SIM_CORES=2, **({} if onednn else {"TORCHTITAN_RUN_NO_ONEDNN": "1"}))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"torchtitan on {device} exited {r.returncode}:\n{out[-6000:]}"
    losses = {}
    for step, loss in STEP.findall(out):
        losses.setdefault(int(step), set()).add(float(loss))
    assert all(len(v) == 1 for v in losses.values()), f"ranks logged different losses: {losses}"
    return [losses[s].pop() for s in sorted(losses)]


@pytest.fixture(scope="module")
def llama_cpu(assets, tmp_path_factory):
    """The default Llama run on CPU, the reference of the eager and the compiled neuron runs."""
    return titan("cpu", assets, tmp_path_factory.mktemp("llama-cpu"))


def test_llama_one_rank_equals_cpu(assets, tmp_path, llama_cpu):
    neuron = titan("neuron", assets, tmp_path / "n")
    assert len(neuron) == STEPS and neuron == llama_cpu  # as logged (5 decimals); selective checkpointing is on


def test_llama_compiled_matches_cpu(assets, tmp_path, llama_cpu):
    # --compile.enable compiles each block with torch.compile's default backend: on neuron, the
    # neuron backend. Selective activation checkpointing replays random ops with the RNG-state
    # higher-order ops, which the compiler does not lower yet (those graphs run eagerly).
    neuron = titan("neuron", assets, tmp_path / "n", "--compile.enable")
    assert neuron == pytest.approx(llama_cpu, rel=1e-4)


def test_llama_two_ranks_ddp_full_checkpointing_equals_gloo(assets, tmp_path):
    args = ("--parallelism.data_parallel_replicate_degree", "2", "--activation_checkpoint.mode", "full")
    neuron = titan("neuron", assets, tmp_path / "n", *args, nproc=2)
    assert neuron == titan("cpu", assets, tmp_path / "c", *args, nproc=2)


def test_llama_fsdp2_and_checkpoint_resume(assets, tmp_path):
    # FSDP2 sums gradients with PREMUL_SUM, which Gloo lacks, so the CPU reference is DDP over the
    # same data split (float32 parameters so that both compute in float32).
    common = ("--training.mixed_precision_param", "float32")
    ddp_cpu = titan("cpu", assets, tmp_path / "c", "--parallelism.data_parallel_replicate_degree", "2", *common,
                    nproc=2)
    ckpt = ("--parallelism.data_parallel_shard_degree", "2", *common, "--checkpoint.enable",
            "--checkpoint.interval", str(STEPS // 2), "--checkpoint.no-last-save-model-only")
    fsdp = titan("neuron", assets, tmp_path / "n", *ckpt, nproc=2)
    assert fsdp == pytest.approx(ddp_cpu, rel=2e-5)
    assert sorted(os.listdir(tmp_path / "n" / "checkpoint")) == sorted([f"step-{STEPS // 2}", f"step-{STEPS}"])
    # Resume from the DCP checkpoint halfway: the second half again, with the same losses.
    shutil.rmtree(tmp_path / "n" / "checkpoint" / f"step-{STEPS}")
    assert titan("neuron", assets, tmp_path / "n", *ckpt, nproc=2) == fsdp[STEPS // 2:]


def test_llama_tensor_parallel_equals_gloo(assets, tmp_path):
    # CPU has no DTensor random-number tracker, so both start from one seed checkpoint (saved by
    # TorchTitan on CPU, loaded through DCP by both).
    titan("cpu", assets, tmp_path / "seed", "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
          "--parallelism.data_parallel_shard_degree", "1")
    args = ("--parallelism.tensor_parallel_degree", "2", "--checkpoint.enable", "--checkpoint.initial_load_path",
            str(tmp_path / "seed" / "checkpoint" / "step-0"), "--checkpoint.interval", "1000")
    neuron = titan("neuron", assets, tmp_path / "n", *args, nproc=2)
    assert neuron == titan("cpu", assets, tmp_path / "c", *args, nproc=2)


def test_llama_pipeline_parallel_equals_gloo(assets, tmp_path):
    # Two stages, 1F1B over two microbatches of 2 (the last stage logs the loss).
    args = ("--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "1F1B",
            "--training.local_batch_size", "4", "--parallelism.pipeline_parallel_microbatch_size", "2")
    neuron = titan("neuron", assets, tmp_path / "n", *args, nproc=2, steps=STEPS - 1)
    assert len(neuron) == STEPS - 1 and neuron == titan("cpu", assets, tmp_path / "c", *args, nproc=2, steps=STEPS - 1)


def test_llama_float8_equals_cpu(assets, tmp_path):
    # TorchTitan allows float8 only on CUDA SM89+ unless `emulate` is set (its check reads CUDA's
    # capability); the float8 casts and scales are the same either way.
    args = ("--model.converters", "quantize.linear.float8", "--quantize.linear.float8.recipe_name", "tensorwise",
            "--quantize.linear.float8.emulate")
    neuron = titan("neuron", assets, tmp_path / "n", *args, steps=STEPS - 1, onednn=False)
    assert neuron == titan("cpu", assets, tmp_path / "c", *args, steps=STEPS - 1, onednn=False)


def test_llama_float8_fsdp2_all_gather_matches_gloo(assets, tmp_path):
    # FSDP2 all-gathers float8 weights cast with a scale precomputed over every shard: the same
    # float8 weights as FSDP2 all-gathering float32 weights and casting them whole, so the losses
    # are those of that run exactly. The CPU reference is DDP (Gloo lacks FSDP2's PREMUL_SUM).
    # FSDP2 and DDP update differently laid-out tensors (shards, whole weights), which round a few
    # elements differently (vectorized bodies, scalar tails); float8 casts then amplify those ulps
    # (a 4.5e-5 relative difference by the third step on an AVX-512 host, where float32 runs agree
    # to the logged digits): a tolerance as for compiled Llama.
    f8 = ("--model.converters", "quantize.linear.float8", "--quantize.linear.float8.emulate",
          "--training.mixed_precision_param", "float32", "--parallelism.data_parallel_shard_degree", "2")
    gathered_f8 = titan("neuron", assets, tmp_path / "n", *f8, "--quantize.linear.float8.enable_fsdp_float8_all_gather",
                        "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", nproc=2, steps=STEPS - 1)
    gathered_f32 = titan("neuron", assets, tmp_path / "n32", *f8, nproc=2, steps=STEPS - 1)
    assert len(gathered_f8) == STEPS - 1 and gathered_f8 == gathered_f32
    ddp = titan("cpu", assets, tmp_path / "c", *f8[:-2], "--parallelism.data_parallel_replicate_degree", "2",
                nproc=2, steps=STEPS - 1)
    assert gathered_f8 == pytest.approx(ddp, rel=1e-4)


def test_deepseek_v3_one_rank_equals_cpu(assets, tmp_path):
    neuron = titan("neuron", assets, tmp_path / "n", model="deepseek_v3", steps=STEPS - 1)
    assert neuron == titan("cpu", assets, tmp_path / "c", model="deepseek_v3", steps=STEPS - 1)


def _zero_gate_biases(dcp_dir, out_dir):
    """A copy of a DCP model checkpoint with every MoE router gate bias set to zero."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp

    flat = out_dir.with_suffix(".pt")
    dcp_to_torch_save(str(dcp_dir), str(flat))
    state = torch.load(flat)
    biases = [k for k in state if k.endswith("router.gate.bias")]
    assert biases, sorted(state)[:10]
    for k in biases:
        state[k] = torch.zeros_like(state[k])
    assert all(v.isfinite().all() for v in state.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    torch.save(state, flat)
    torch_save_to_dcp(str(flat), str(out_dir))
    return out_dir


def test_gpt_oss_one_rank_equals_cpu(assets, tmp_path):
    # GPT-OSS: MoE with a biased router, FlexAttention with sinks and sliding windows (TorchTitan
    # compiles create_block_mask and flex_attention with the default backend: on neuron, the
    # neuron backend, whose generated FlexAttention kernels round otherwise than CPU's dense
    # implementation, hence a relative tolerance as for compiled Llama). TorchTitan 0.2.2 never initialises the router's gate bias (its
    # init_weights sets the weight only), so a run from scratch starts from whatever memory
    # to_empty gave it (zeros from fresh pages, garbage or NaN from reused memory). Both runs start
    # from one seed checkpoint (made on CPU) whose gate biases the test sets to zero.
    titan("cpu", assets, tmp_path / "seed", "--checkpoint.enable", "--checkpoint.create_seed_checkpoint",
          "--parallelism.data_parallel_shard_degree", "1", model="gpt_oss", steps=1)
    seed = _zero_gate_biases(tmp_path / "seed" / "checkpoint" / "step-0", tmp_path / "seed-defined")
    args = ("--checkpoint.enable", "--checkpoint.initial_load_path", str(seed), "--checkpoint.interval", "1000")
    neuron = titan("neuron", assets, tmp_path / "n", *args, model="gpt_oss", steps=STEPS - 1)
    assert len(neuron) == STEPS - 1 and neuron[-1] < neuron[0]
    assert neuron == pytest.approx(titan("cpu", assets, tmp_path / "c", *args, model="gpt_oss", steps=STEPS - 1),
                                   rel=1e-4)
