"""vLLM on ``neuron``: the platform plugin.

vLLM finds it through the ``vllm.platform_plugins`` entry point ``neuron``; with torch-neuronx
and ``vllm==0.32.0`` installed, ``LLM(model=...)`` and ``vllm serve`` run on the ``neuron``
device without other changes (the device comes from the platform: vLLM 0.32's engine arguments
have no ``device`` field). ``VLLM_PLUGINS`` selects plugins and ``VLLM_TARGET_DEVICE=cpu``
bypasses them, as for any vLLM platform plugin.

The plugin is made of the platform (``platform.py``), the worker and model runner
(``worker.py``), a paged-attention backend (``attention.py``), the unquantized MoE method
(``moe.py``) and torch implementations of the Triton kernels vLLM's scheduler path runs
(``kernels.py``). See docs/vllm.md.
"""

SUPPORTED_VLLM = "0.32.0"


def register():
    """Entry point of the ``vllm.platform_plugins`` group: the platform class's qualified name.

    vLLM calls this in every process it starts. It returns ``None`` (the plugin stays inactive)
    when the installed vLLM is not the version this plugin was written against, and logs why:
    vLLM's internal interfaces change between releases."""
    import logging

    try:
        from importlib.metadata import version

        found = version("vllm")
    except Exception:  # vLLM not installed: nothing to register
        return None
    if found.split("+")[0] != SUPPORTED_VLLM:
        logging.getLogger(__name__).warning(
            "torch_neuronx.vllm supports vllm==%s; vllm %s is installed, so the neuron platform is "
            "not registered. Install vllm==%s (see docs/vllm.md).", SUPPORTED_VLLM, found, SUPPORTED_VLLM)
        return None
    return "torch_neuronx.vllm.platform.NeuronPlatform"
