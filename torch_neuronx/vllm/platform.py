"""The vLLM ``Platform`` for the ``neuron`` device."""
import os

import torch
from vllm.logger import init_logger
from vllm.platforms.interface import Platform, PlatformEnum

logger = init_logger(__name__)

_PKG = "torch_neuronx.vllm"


class NeuronPlatform(Platform):
    """vLLM platform: models, the paged KV cache and collectives on ``neuron`` devices."""

    _enum = PlatformEnum.OOT
    device_name = "neuron"
    device_type = "neuron"
    # vLLM registers its custom ops (attention, all-reduce wrappers) under this key.
    dispatch_key = "PrivateUse1"
    dist_backend = "neuron"
    ray_device_key = "neuron"
    device_control_env_var = "NEURON_RT_VISIBLE_CORES"
    # vLLM torch.compiles a few helpers with this backend; its Inductor default would emit Triton.
    simple_compile_backend = "neuron"

    @classmethod
    def import_kernels(cls) -> None:
        # The wheel's vllm._C is CUDA's; everything the plugin runs is torch ops on neuron.
        import torch_neuronx  # noqa: F401

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.neuron.get_device_name(device_id)

    @classmethod
    def get_device_uuid(cls, device_id: int = 0) -> str:
        return f"neuron-{device_id}"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.neuron.get_device_properties(device_id).total_memory

    @classmethod
    def get_current_memory_usage(cls, device=None) -> float:
        torch.neuron.reset_peak_memory_stats(device)
        return float(torch.neuron.max_memory_allocated(device))

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        torch.neuron.set_device(device)

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        torch.neuron.manual_seed_all(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        # Host memory is the device's; a pinned staging copy would only add a copy.
        return False

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        from .attention import NeuronAttentionBackend

        path = f"{_PKG}.attention.NeuronAttentionBackend"
        if selected_backend is not None and selected_backend not in (AttentionBackendEnum.CUSTOM,):
            logger.warning("attention backend %s is not available on neuron; using %s",
                           selected_backend.name, path)
        reasons = NeuronAttentionBackend.validate_configuration(
            **attn_selector_config._asdict(), device_capability=cls.get_device_capability())
        if reasons:
            raise ValueError(f"the neuron vLLM attention backend cannot run this model's attention: "
                             f"{', '.join(reasons)} ({attn_selector_config})")
        register_backend(AttentionBackendEnum.CUSTOM, path)
        return path

    @classmethod
    def register_triton_kernel_overrides(cls) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        from .kernels import TRITON_OVERRIDES

        register_kernels(TRITON_OVERRIDES)

    @classmethod
    def check_if_supports_dtype(cls, dtype: torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"neuron runs models in float32, bfloat16 or float16, not {dtype}")

    @classmethod
    def verify_quantization(cls, quant: str) -> None:
        # vLLM's quantized linear and MoE methods are CUDA kernels (an empty
        # supported_quantization list would let every method through).
        raise ValueError(f"{quant} quantization is not supported on neuron: the neuron vLLM plugin runs "
                         "unquantized float32, bfloat16 or float16 checkpoints")

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        return False

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        from vllm.config import CompilationMode, CUDAGraphMode

        cc = vllm_config.compilation_config
        if cc.mode != CompilationMode.NONE:
            logger.info("neuron: vLLM's compilation mode %s is not used; the model runs eagerly", cc.mode)
        cc.mode = CompilationMode.NONE
        cc.cudagraph_mode = CUDAGraphMode.NONE
        cc.cudagraph_capture_sizes = []
        # Async scheduling overlaps steps with CUDA streams and pinned copies of its own.
        vllm_config.scheduler_config.async_scheduling = False
        # JIT warm-up compiles Triton kernels.
        vllm_config.kernel_config.enable_jit_warmup = False
        parallel = vllm_config.parallel_config
        if parallel.data_parallel_size > 1:
            # Replicas would need device offsets and padded-batch handling the worker lacks.
            raise ValueError("data parallelism (data_parallel_size > 1) is not supported on neuron; "
                             "use tensor or pipeline parallelism")
        if parallel.worker_cls == "auto":
            parallel.worker_cls = f"{_PKG}.worker.NeuronWorker"
        # An initialised device cannot be forked (its engine threads do not survive fork).
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        cache = vllm_config.cache_config
        if cache.block_size is None:
            cache.block_size = 16
        # The model runner imports the MoE method in every worker; importing it here registers
        # it in the engine process too.
        from . import moe  # noqa: F401
