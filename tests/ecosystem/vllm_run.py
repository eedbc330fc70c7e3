"""Runs vLLM's offline engine unchanged on the platform the plugin selects: `vllm_run.py SPEC.json`.

SPEC: {"engine": {LLM keyword arguments}, "jobs": [{"name", "prompts": [[token ids]...],
"sampling": {SamplingParams keyword arguments}, "one_by_one": bool}...]}. Prints one line
`RESULT <json>`: per job the generated token ids, cached-prefix lengths and wall time, the platform's name,
and what each worker reports about its KV cache and device memory."""
import json
import os
import sys
import time


def kv_cache_report(worker):
    """Runs inside each worker (collective_rpc): where the KV cache lives and how big it is."""
    import torch

    runner = worker.model_runner
    caches = [c for c in runner.kv_caches if isinstance(c, torch.Tensor)]
    free, total = torch.neuron.mem_get_info(worker.device) if worker.device.type == "neuron" else (0, 0)
    return {"devices": sorted({str(c.device) for c in caches}), "layers": len(caches),
            "bytes": sum(c.untyped_storage().nbytes() for c in {c.untyped_storage().data_ptr(): c for c in caches}.values()),
            "num_blocks": worker.cache_config.num_gpu_blocks, "total": total, "free": free,
            "requested": getattr(worker, "requested_memory", None),
            "non_kv": getattr(worker, "available_kv_cache_memory_bytes", None)}


def main():
    spec = json.load(open(sys.argv[1]))
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    llm = LLM(**spec["engine"])
    result = {"platform": current_platform.device_type, "jobs": {}}
    for job in spec["jobs"]:
        prompts = [{"prompt_token_ids": p} for p in job["prompts"]]
        params = SamplingParams(detokenize=False, **job["sampling"])
        start = time.perf_counter()
        if job.get("one_by_one"):
            outs = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
        else:
            outs = llm.generate(prompts, params, use_tqdm=False)
        result["jobs"][job["name"]] = {"tokens": [list(o.outputs[0].token_ids) for o in outs],
                                       "cached": [o.num_cached_tokens for o in outs],
                                       "seconds": time.perf_counter() - start}
    result["workers"] = llm.collective_rpc(kv_cache_report)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # kv_cache_report is a function
    main()
