"""``torch.compile`` on ``neuron``: the Dynamo backend ``neuron``.

Dynamo captures the graph; AOTAutograd splits forward and backward (min-cut rematerialization),
functionalizes and decomposes it to core ATen, keeping whole the ops the compiler runs better as
one library kernel (matmuls, convolution, attention, normalizations, softmax, losses). Each graph is
handed once to the C++ compiler (``torch_neuronx._C._compiler``): DCE, CSE, fusion of pointwise
chains into generated C++ loops (built with the system compiler, cached on disk), and ATen library
calls for the rest. The executable runs on the current stream as one task.

Usage::

    torch.compiler.set_default_backend("neuron")
    model.compile()
    # or torch.compile(model, backend="neuron")
"""
from .backend import neuron_backend  # noqa: F401
from .metrics import compile_metrics, reset_compile_metrics  # noqa: F401

__all__ = ["neuron_backend", "compile_metrics", "reset_compile_metrics"]
