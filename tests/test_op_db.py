"""PyTorch's device-generic OpInfo tests, instantiated for ``neuron``.

``instantiate_device_type_tests(..., only_for="neuron")`` with ``@ops`` over a curated fast subset
of ``op_db`` (the ops of the CI conformance subset): every sample input, on neuron against CPU,
through the same checks as the full sweep (``python -m torch_neuronx.conformance``).
"""
import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

import torch_neuronx  # noqa: F401
from torch_neuronx.conformance import op_checks
from torch_neuronx.conformance.cli import QUICK_OPS

SUBSET = [op for op in op_db if op_checks.op_key(op).split(".")[0] in QUICK_OPS or op_checks.op_key(op) in QUICK_OPS]
DTYPES = (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64)


class TestNeuronOpInfo(TestCase):
    def _each_sample(self, op, device, dtype, check, requires_grad=False):
        """Runs check on every sample; fails if none ran, or skips with the checks' reasons when
        none applies (e.g. CPU rejects every sample for this dtype)."""
        ran, reasons = 0, []
        for sample in op.sample_inputs(device, dtype, requires_grad=requires_grad):
            try:
                check(sample)
                ran += 1
            except op_checks.Outcome as o:
                reasons.append(o.detail)  # the check does not apply to this sample
        if ran == 0:
            if not reasons:
                self.fail(f"{op.name}: no sample inputs for {dtype}")
            self.skipTest(f"no sample applies: {sorted(set(reasons))[0][:200]}")
        return ran

    @ops(SUBSET, allowed_dtypes=DTYPES)
    def test_forward_matches_cpu(self, device, dtype, op):
        self.assertEqual(torch.device(device).type, "neuron")
        self._each_sample(op, device, dtype, lambda s: op_checks.check_forward(op, s))

    @ops([op for op in SUBSET if op.supports_out], allowed_dtypes=DTYPES)
    def test_out_matches_cpu(self, device, dtype, op):
        self._each_sample(op, device, dtype, lambda s: op_checks.check_out(op, s))

    @ops([op for op in SUBSET if op.inplace_variant is not None], allowed_dtypes=DTYPES)
    def test_inplace_matches_cpu(self, device, dtype, op):
        self._each_sample(op, device, dtype, lambda s: op_checks.check_inplace(op, s))

    @ops(SUBSET, allowed_dtypes=(torch.float32,))
    def test_noncontiguous_matches_cpu(self, device, dtype, op):
        self._each_sample(op, device, dtype, lambda s: op_checks.check_noncontiguous(op, s))

    @ops([op for op in SUBSET if op.supports_autograd], allowed_dtypes=(torch.float32, torch.complex64))
    def test_backward_matches_cpu(self, device, dtype, op):
        self._each_sample(op, device, dtype, lambda s: op_checks.check_backward(op, s, dtype), requires_grad=True)

    @ops([op for op in SUBSET if op.error_inputs_func is not None], dtypes=(torch.float32,))
    def test_error_inputs_match_cpu(self, device, dtype, op):
        errs = list(op.error_inputs(device))
        if not errs:
            self.skipTest(f"{op.name} yields no error inputs for {device}")
        for err in errs:
            op_checks.check_error_input(op, err)


instantiate_device_type_tests(TestNeuronOpInfo, globals(), only_for="neuron")
