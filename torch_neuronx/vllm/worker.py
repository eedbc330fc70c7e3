"""vLLM worker and model runner for ``neuron``: vLLM's GPU worker with the device parts replaced.

vLLM's CPU worker would need its compiled CPU extension (and patches ``torch.cuda`` globally when
imported); the GPU worker is device-generic apart from device initialisation, the CuMem memory
pool and a few CUDA events and Triton kernels, which are replaced here.
"""
import gc
from contextlib import nullcontext

import torch
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.utils.gc_utils import freeze_gc_heap
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment
from vllm.v1.worker.utils import request_memory
from vllm.utils.mem_utils import MemorySnapshot

from . import moe  # noqa: F401  (registers the MoE method in this worker process)

logger = init_logger(__name__)


class NeuronModelRunner(GPUModelRunner):
    """GPU model runner whose host copies and KV-block zeroing are plain torch ops on ``neuron``."""

    def _to_list(self, sampled_token_ids: torch.Tensor) -> list[list[int]]:
        # CUDA stages this through a pinned buffer and an event to avoid a device-wide sync;
        # reading the tensor synchronises only its own stream here.
        return sampled_token_ids.tolist()

    def _init_kv_zero_meta(self) -> None:
        # vLLM's zeroer is a Triton kernel over raw addresses; keep the per-layer block views.
        self._kv_zero_views = []
        for group in self._kv_cache_spec_attn_group_iterator():
            for name in group.layer_names:
                kv = self.compilation_config.static_forward_context[name].kv_cache
                if isinstance(kv, torch.Tensor) and kv.device.type == "neuron":
                    self._kv_zero_views.append(kv.view(self.kv_cache_config.num_blocks, -1))

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        if not block_ids or not getattr(self, "_kv_zero_views", None):
            return
        index = torch.tensor(block_ids, dtype=torch.long).to(self.device)
        for view in self._kv_zero_views:
            view.index_fill_(0, index, 0)


class NeuronWorker(Worker):
    """One vLLM worker process on one ``neuron`` device (``neuron:<local_rank>``)."""

    def init_device(self):
        if self.use_v2_model_runner:
            raise ValueError("vLLM's V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1) is Triton-only; the neuron "
                             "worker runs the V1 model runner")
        if self.local_rank >= torch.neuron.device_count():
            raise ValueError(f"worker {self.local_rank} needs neuron:{self.local_rank}, but "
                             f"{torch.neuron.device_count()} neuron devices are visible (TORCH_NEURONX_SIM_CORES "
                             "sets how many the simulated device has)")
        self.device = torch.device(f"neuron:{self.local_rank}")
        torch.neuron.set_device(self.device)
        current_platform.check_if_supports_dtype(self.model_config.dtype)
        # Collectives first, so their buffers are in the memory snapshot (as on CUDA).
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, current_platform.dist_backend)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.neuron.empty_cache()
        # vLLM's memory profiler (torch.accelerator statistics) sizes the KV cache from this
        # snapshot and gpu_memory_utilization, as on CUDA.
        self.init_snapshot = MemorySnapshot(device=self.device)
        self.requested_memory = request_memory(self.init_snapshot, self.cache_config, 0)
        self._init_workspace_and_model_runner()

    def _make_model_runner(self):
        return NeuronModelRunner(self.vllm_config, self.device)

    def _maybe_get_memory_pool_context(self, tag: str):
        # No CuMem allocator (sleep mode) on neuron: tensors come from the caching allocator.
        return nullcontext()

    def compile_or_warm_up_model(self):
        # vLLM's version also runs its kernel warm-ups, which import model-specific CUDA/Triton
        # code (and torchvision); neuron has no CUDA graphs to capture. What is left: the
        # sampler warm-up at the largest batch (it allocates the sampling buffers once), LoRA
        # clean-up, the seed reset after profiling and the GC freeze.
        from vllm.config import CUDAGraphMode
        from vllm.distributed.parallel_state import get_pp_group
        from vllm.v1.worker.worker_base import CompilationTimes

        runner = self.model_runner
        if get_pp_group().is_last_rank:
            n = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
            hidden, last_hidden = runner._dummy_run(num_tokens=n, skip_eplb=True,
                                                    cudagraph_runtime_mode=CUDAGraphMode.NONE)
            if runner.is_pooling_model:
                runner._dummy_pooler_run(hidden)
            else:
                runner._dummy_sampler_run(hidden_states=last_hidden)
        runner.maybe_remove_all_loras(runner.lora_config)
        set_random_seed(self.model_config.seed, self.parallel_config.data_parallel_index)
        freeze_gc_heap()  # as vLLM: the collector no longer scans weights and caches
        return CompilationTimes(language_model=0.0, encoder=0.0)
