"""The conformance sweep: every OpInfo, ModuleInfo and OptimizerInfo that the torch wheel ships
in ``torch.testing._internal``, run on ``neuron`` and compared with CPU.

Run ``python -m torch_neuronx.conformance --help``. The full sweep writes ``docs/op_support.md``;
``--quick`` is the CI subset, checked against the committed baseline of passing cases.
"""
