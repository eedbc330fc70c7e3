"""vLLM 0.32.0 on neuron through the platform plugin (issue 28 §1): vLLM's offline engine, unchanged,
serves tiny Llama, Qwen2 and Mixtral models saved from configs, and its greedy tokens equal Hugging
Face `generate` on CPU token for token. Each engine runs in a subprocess
(tests/ecosystem/vllm_run.py) that reports tokens, cached-prefix lengths and each worker's KV cache."""
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import clean_env

pytest.importorskip("vllm", reason="vllm==0.32.0 is installed by `make test` (see docs/vllm.md)")

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "ecosystem", "vllm_run.py")
HBM = 1 << 30  # the simulated device's memory in these runs: the KV cache fills its share of it
UTILIZATION = 0.5
MAX_TOKENS = 10

# Requests of different lengths: more than max_num_seqs at once (the scheduler batches them
# continuously) and one longer than max_num_batched_tokens (its prefill is chunked).
PROMPTS = [[1, 5, 9, 13, 17], list(range(7, 24)), list(range(3, 81)), [1, 100, 101], list(range(200, 207))]
SHARED = list(range(30, 78))  # 3 blocks of 16 shared by the next prompts: prefix-cache hits
PREFIXED = [SHARED + [90 + i, 100 + i] for i in range(4)]
ENGINE = {"skip_tokenizer_init": True, "dtype": "float32", "max_model_len": 128, "max_num_seqs": 4,
          "max_num_batched_tokens": 64, "gpu_memory_utilization": UTILIZATION}
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


def test_pinned_version_and_entry_point():
    from importlib.metadata import entry_points, version

    import torch_neuronx.vllm

    assert version("vllm") == torch_neuronx.vllm.SUPPORTED_VLLM == "0.32.0"
    (ep,) = [e for e in entry_points(group="vllm.platform_plugins") if e.name == "neuron"]
    assert ep.load()() == "torch_neuronx.vllm.platform.NeuronPlatform"


def test_register_declines_another_vllm(monkeypatch):
    import importlib.metadata
    import logging

    import torch_neuronx.vllm

    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("torch_neuronx.vllm")
    logger.addHandler(handler)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.31.0")
    try:
        assert torch_neuronx.vllm.register() is None
    finally:
        logger.removeHandler(handler)
    assert any("supports vllm==0.32.0; vllm 0.31.0 is installed" in m for m in records)


def _slot_mapping_reference(qsl, positions, table, block, cp_world=1, cp_rank=0, interleave=1, pad=-1):
    out = []
    for r in range(len(qsl) - 1):
        for t in range(qsl[r], qsl[r + 1]):
            p = positions[t]
            vb, vo = divmod(p, block * cp_world)
            if (vo // interleave) % cp_world != cp_rank:
                out.append(pad)
                continue
            local = (vo // (cp_world * interleave)) * interleave + vo % interleave
            out.append(table[r][vb] * block + local)
    return out


@pytest.mark.parametrize("cp_world,cp_rank,interleave", [(1, 0, 1), (2, 1, 1), (2, 0, 4)])
def test_slot_mapping_kernel(cp_world, cp_rank, interleave):
    """The torch slot-mapping kernel (vLLM's Triton kernel on other platforms) against a loop."""
    from torch_neuronx.vllm.kernels import compute_slot_mapping

    g = torch.Generator().manual_seed(0)
    lens = [1, 37, 1, 300, 5]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    starts = [0, 4, 90, 17, 600]
    positions = [s + i for s, n in zip(starts, lens) for i in range(n)]
    table = torch.randperm(4000, generator=g)[: 5 * 64].view(5, 64).int()
    n = len(positions)
    slots = torch.empty(n + 11, dtype=torch.long, device="neuron")
    compute_slot_mapping(n, n + 11, torch.tensor(qsl, dtype=torch.int32).neuron(),
                         torch.tensor(positions).neuron(), table.neuron().flatten(), 64, slots, 16, cp_world,
                         cp_rank, interleave, -1, 1024)
    expect = _slot_mapping_reference(qsl, positions, table.tolist(), 16, cp_world, cp_rank, interleave)
    assert slots.cpu().tolist() == expect + [-1] * 11


@pytest.mark.parametrize("scoring,renormalize,bias", [("softmax", True, False), ("softmax", False, False),
                                                       ("sigmoid", True, True)])
def test_moe_experts_match_per_token_reference(scoring, renormalize, bias):
    """The MoE method's routing and sorted-by-expert GEMMs against a loop over tokens and their experts."""
    from torch_neuronx.vllm.moe import experts, route

    g = torch.Generator().manual_seed(0)
    tokens, hidden, inter, num_experts, top_k = 300, 64, 96, 8, 2
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / 8
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / 8
    logits = torch.randn(tokens, num_experts, generator=g)
    logits[:, 5] = -30  # an expert no token picks
    correction = torch.randn(num_experts, generator=g) if bias else None
    weights, ids = route(logits.neuron(), top_k, scoring, renormalize,
                         None if correction is None else correction.neuron())
    got = experts(x.neuron(), w13.neuron(), w2.neuron(), weights, ids).cpu()
    expect = torch.zeros(tokens, hidden)
    for t in range(tokens):
        scores = logits[t].softmax(-1) if scoring == "softmax" else logits[t].sigmoid()
        choice = sorted(range(num_experts), key=lambda e: -float(scores[e] + (correction[e] if bias else 0)))[:top_k]
        w = scores[choice]
        if renormalize:
            w = w / w.sum()
        for e, we in zip(choice, w):
            h = w13[e] @ x[t]
            expect[t] += we * (w2[e] @ (torch.nn.functional.silu(h[:inter]) * h[inter:]))
    torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-5)


def test_moe_refuses_layers_it_cannot_run():
    import types

    from torch_neuronx.vllm.moe import NeuronUnquantizedFusedMoEMethod

    layer = types.SimpleNamespace(use_grouped_topk=True, custom_routing_function=None, routed_scaling_factor=1.0,
                                  local_num_experts=4, global_num_experts=4, swiglu_limit=7.0, w13_bias=torch.zeros(1))
    method = object.__new__(NeuronUnquantizedFusedMoEMethod)
    with pytest.raises(NotImplementedError, match="grouped top-k routing, expert biases, a SwiGLU limit"):
        method.apply_monolithic(layer, torch.zeros(2, 4), torch.zeros(2, 4))


@pytest.mark.parametrize("window,soft_cap", [(None, None), (6, None), (None, 5.0)],
                         ids=["causal", "sliding_window", "soft_cap"])
def test_paged_attention_matches_dense_reference(monkeypatch, window, soft_cap):
    """The backend's step: new keys/values written by slot, then prefills (one after a cached
    prefix, chunked) and batched decodes over the paged cache, against dense attention on CPU."""
    import types

    from torch_neuronx.vllm import attention as A

    g = torch.Generator().manual_seed(0)
    heads, kv_heads, hs, bs, num_blocks = 4, 2, 16, 4, 40
    # (tokens already in the cache, new tokens): decodes, a first prefill, a chunk after a prefix.
    reqs = [(9, 1), (0, 7), (13, 1), (5, 6), (2, 1)]
    table = torch.randperm(num_blocks - 1, generator=g)[: 5 * 6].view(5, 6) + 1  # block 0 is vLLM's null block
    cache = torch.zeros(num_blocks, kv_heads, bs, 2 * hs)
    keys = [torch.randn(c + n, kv_heads, hs, generator=g) for c, n in reqs]
    values = [torch.randn(c + n, kv_heads, hs, generator=g) for c, n in reqs]
    for r, (c, _) in enumerate(reqs):  # the cached history, written as earlier steps would have
        for p in range(c):
            cache[table[r, p // bs], :, p % bs] = torch.cat([keys[r][p], values[r][p]], -1)
    qsl, slots, new_k, new_v = [0], [], [], []
    for r, (c, n) in enumerate(reqs):
        qsl.append(qsl[-1] + n)
        slots += [int(table[r, p // bs]) * bs + p % bs for p in range(c, c + n)]
        new_k.append(keys[r][c:])
        new_v.append(values[r][c:])
    total = qsl[-1]
    query = torch.randn(total, heads * hs, generator=g)
    seq = torch.tensor([c + n for c, n in reqs], dtype=torch.int32)
    cm = types.SimpleNamespace(num_reqs=5, num_actual_tokens=total, query_start_loc_cpu=torch.tensor(qsl),
                               seq_lens_cpu_upper_bound=seq, seq_lens=seq.neuron(),
                               slot_mapping=torch.tensor(slots + [-1, -1]).neuron(),
                               block_table_tensor=table.int().neuron())
    builder = object.__new__(A.NeuronAttentionMetadataBuilder)
    builder.block_size = bs
    md = builder.build(0, cm)
    assert md.decode_rows.tolist() == [qsl[0], qsl[2], qsl[4]] and len(md.prefills) == 2
    impl = A.NeuronAttentionImpl(heads, hs, 0.25, kv_heads, sliding_window=window, kv_cache_dtype="auto",
                                 logits_soft_cap=soft_cap)
    monkeypatch.setattr(A, "_metadata_for", lambda layer: md)
    kv = cache.neuron()
    pad = torch.zeros(2, kv_heads * hs)
    impl.do_kv_cache_update(None, torch.cat(new_k + [pad.view(2, kv_heads, hs)]).neuron(),
                            torch.cat(new_v + [pad.view(2, kv_heads, hs)]).neuron(), kv, cm.slot_mapping)
    out = torch.full((total + 2, heads * hs), 7.0).neuron()
    impl.forward(None, torch.cat([query, torch.zeros(2, heads * hs)]).neuron(), None, None, kv, md, out)
    out = out.cpu()
    assert torch.equal(out[total:], torch.full((2, heads * hs), 7.0))  # padding rows untouched
    for r, (c, n) in enumerate(reqs):
        q = query[qsl[r]:qsl[r + 1]].view(n, heads, hs).transpose(0, 1)
        k = keys[r].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = values[r].transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        dist = torch.arange(c, c + n).view(-1, 1) - torch.arange(c + n).view(1, -1)
        visible = (dist >= 0) & (dist < (window or 1 << 30))
        scores = q @ k.transpose(1, 2) * 0.25
        if soft_cap:
            scores = torch.tanh(scores / soft_cap) * soft_cap
        expect = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1) @ v
        torch.testing.assert_close(out[qsl[r]:qsl[r + 1]], expect.transpose(0, 1).reshape(n, -1),
                                   rtol=1e-5, atol=1e-5)


def test_unsupported_requests_raise_clear_errors():
    from torch_neuronx.vllm.attention import NeuronAttentionImpl
    from torch_neuronx.vllm.platform import NeuronPlatform

    with pytest.raises(ValueError, match="fp8 quantization is not supported on neuron"):
        NeuronPlatform.verify_quantization("fp8")
    with pytest.raises(ValueError, match="float32, bfloat16 or float16, not torch.int8"):
        NeuronPlatform.check_if_supports_dtype(torch.int8)
    with pytest.raises(NotImplementedError, match="ALiBi"):
        NeuronAttentionImpl(4, 16, 0.25, alibi_slopes=[1.0] * 4)
    with pytest.raises(NotImplementedError, match="attention sinks, KV cache dtype fp8"):
        NeuronAttentionImpl(4, 16, 0.25, kv_cache_dtype="fp8", sinks=torch.zeros(4))


def _save(kind, path):
    from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=2)
    config, model = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                     "mixtral": (MixtralConfig, MixtralForCausalLM)}[kind]
    extra = {"num_local_experts": 4, "num_experts_per_tok": 2} if kind == "mixtral" else {}
    torch.manual_seed(0)
    model(config(**common, **extra)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    return {k: _save(k, str(root / k)) for k in ("llama", "qwen2", "mixtral")}


def hf_greedy(path, prompts):
    """Hugging Face `generate` on CPU, float32: the reference tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return [model.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]


def serve(tmp_path, model, jobs, tp=1, pipeline_parallel_size=1, in_process=False, **engine):
    """Runs vLLM's engine in a fresh process; returns what tests/ecosystem/vllm_run.py reports.

    ``in_process``: the engine core and its worker run in that process (vLLM's
    VLLM_ENABLE_V1_MULTIPROCESSING=0) instead of two spawned ones; 7 s less per run."""
    spec = tmp_path / f"spec-{len(list(tmp_path.iterdir()))}.json"
    spec.write_text(json.dumps({"engine": {**ENGINE, "model": model, "tensor_parallel_size": tp,
                                           "pipeline_parallel_size": pipeline_parallel_size, **engine},
                                "jobs": jobs}))
    env = clean_env(TORCH_NEURONX_SIM_HBM=HBM, TORCH_NEURONX_SIM_CORES=tp * pipeline_parallel_size,
                    VLLM_ENABLE_V1_MULTIPROCESSING=0 if in_process else 1)
    r = subprocess.run([sys.executable, RUN, str(spec)], env=env, capture_output=True, text=True, timeout=600,
                       cwd=str(tmp_path))
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"vLLM exited {r.returncode}:\n{out[-6000:]}"
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["platform"] == "neuron"
    return result


def _check_kv_cache(workers, tp):
    assert len(workers) == tp
    for w in workers:
        assert len(w["devices"]) == 1 and w["devices"][0].startswith("neuron:")
        assert w["total"] == HBM
        assert w["requested"] == int(UTILIZATION * HBM)
        # The cache takes what the profile run left of the requested share (weights and
        # activations of these models are a few MiB).
        assert 0.95 * w["requested"] < w["bytes"] <= w["requested"]
        assert w["free"] <= HBM - w["bytes"]


def test_llama_greedy_batching_prefix_caching_and_seeded_sampling(tmp_path, models):
    sample = {"max_tokens": MAX_TOKENS, "temperature": 0.9, "top_p": 0.9, "top_k": 50, "ignore_eos": True}
    jobs = [{"name": "batched", "prompts": PROMPTS, "sampling": GREEDY},
            {"name": "one_by_one", "prompts": PROMPTS, "sampling": GREEDY, "one_by_one": True},
            {"name": "warm", "prompts": PREFIXED[:1], "sampling": GREEDY},
            {"name": "prefixed", "prompts": PREFIXED, "sampling": GREEDY},
            {"name": "seed_a", "prompts": PROMPTS[:3], "sampling": {**sample, "seed": 1234}},
            {"name": "seed_a_again", "prompts": PROMPTS[:3], "sampling": {**sample, "seed": 1234}},
            {"name": "seed_b", "prompts": PROMPTS[:3], "sampling": {**sample, "seed": 4321}}]
    # In-process engine (the spawned engine and workers are tested with two devices).
    r = serve(tmp_path, models["llama"], jobs, in_process=True, enable_prefix_caching=True)
    jobs = r["jobs"]
    expect = hf_greedy(models["llama"], PROMPTS + PREFIXED)
    assert jobs["batched"]["tokens"] == expect[:len(PROMPTS)]
    assert jobs["one_by_one"]["tokens"] == expect[:len(PROMPTS)]
    assert jobs["prefixed"]["tokens"] == expect[len(PROMPTS):]
    # The shared 48-token prefix (3 full blocks) was served from the cache after the warm-up.
    assert jobs["prefixed"]["cached"] == [48] * len(PREFIXED)
    assert jobs["seed_a"]["tokens"] == jobs["seed_a_again"]["tokens"]
    assert jobs["seed_a"]["tokens"] != jobs["seed_b"]["tokens"]
    assert jobs["seed_a"]["tokens"] != expect[:3]
    _check_kv_cache(r["workers"], 1)


# Pipeline parallel and `vllm serve` run in `make ecosystem` (VLLM_TESTS_FULL=1): they keep make
# test's stack checks within their 5 minutes.
FULL = os.environ.get("VLLM_TESTS_FULL") == "1"
TWO_DEVICES = [pytest.param(2, 1, id="tensor_parallel_2")]
if FULL:
    TWO_DEVICES.append(pytest.param(1, 2, id="pipeline_parallel_2"))


@pytest.mark.parametrize("tp,pp", TWO_DEVICES)
def test_llama_two_devices_without_prefix_caching(tmp_path, models, tp, pp):
    jobs = [{"name": "batched", "prompts": PROMPTS + PREFIXED, "sampling": GREEDY}]
    r = serve(tmp_path, models["llama"], jobs, tp=tp, pipeline_parallel_size=pp, enable_prefix_caching=False)
    assert r["jobs"]["batched"]["tokens"] == hf_greedy(models["llama"], PROMPTS + PREFIXED)
    assert r["jobs"]["batched"]["cached"] == [0] * len(PROMPTS + PREFIXED)
    _check_kv_cache(r["workers"], 2)
    assert sorted(w["devices"][0] for w in r["workers"]) == ["neuron:0", "neuron:1"]


@pytest.mark.parametrize("kind", ["qwen2", "mixtral"])
def test_qwen2_and_mixtral_greedy(tmp_path, models, kind):
    jobs = [{"name": "batched", "prompts": PROMPTS, "sampling": GREEDY}]
    r = serve(tmp_path, models[kind], jobs, in_process=True, enable_prefix_caching=True)
    assert r["jobs"]["batched"]["tokens"] == hf_greedy(models[kind], PROMPTS)


@pytest.mark.skipif(not FULL, reason="make ecosystem runs it (VLLM_TESTS_FULL=1)")
def test_vllm_serve_openai_completions(tmp_path, models):
    """`vllm serve` (the OpenAI-compatible server) on neuron answers a completion with HF's tokens."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", models["llama"], "--skip-tokenizer-init",
           "--dtype", "float32", "--max-model-len", "128", "--gpu-memory-utilization", str(UTILIZATION),
           "--host", "127.0.0.1", "--port", str(port)]
    env = clean_env(TORCH_NEURONX_SIM_HBM=HBM, VLLM_NO_USAGE_STATS=1)
    log = open(tmp_path / "serve.log", "w+")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, "vllm serve exited:\n" + open(tmp_path / "serve.log").read()[-6000:]
            try:
                urllib.request.urlopen(base + "/health", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "vllm serve did not become healthy in 300 s"
                time.sleep(1)
        body = {"model": models["llama"], "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(req, timeout=120))
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    (choice,) = reply["choices"]
    assert choice["token_ids"] == hf_greedy(models["llama"], [PROMPTS[1]])[0]
    assert reply["usage"]["completion_tokens"] == MAX_TOKENS
