"""The per-architecture checks of the sweep: forward, one training step and greedy generation of
a tiny random model on neuron against the same model on CPU. A check whose CPU reference itself
raises is reported as ``cpu-fail`` (a limit of the library or of the tiny config, not of the
backend)."""
import copy
import functools

import torch

from ..conformance.compare import assert_same
from ..conformance.op_checks import Outcome, counting_eager_graphs
from . import tiny

DEVICE = "neuron"
BATCH, SEQ, NEW_TOKENS = 2, 8, 8
RTOL, ATOL = 1e-4, 1e-4
GRAD_RTOL, GRAD_ATOL = 1e-3, 1e-4

# table name -> (auto class name, checks, whether encoder configs act as decoders)
TABLES = {
    "causal-lm": ("AutoModelForCausalLM", ("forward", "train", "generate"), True),
    "masked-lm": ("AutoModelForMaskedLM", ("forward", "train"), False),
    "seq2seq": ("AutoModelForSeq2SeqLM", ("forward", "train", "generate"), False),
    "image-classification": ("AutoModelForImageClassification", ("forward", "train"), False),
}
MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}


def architectures(table):
    from transformers.models.auto import modeling_auto
    return list(getattr(modeling_auto, MAPPINGS[table]))


def _first_line(e):
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {(lines[0] if lines else '')[:240]}"


def _cpu(fn, what):
    """Run a CPU reference step; its failure is the library's, reported as cpu-fail."""
    try:
        return fn()
    except Outcome:
        raise
    except Exception as e:
        raise Outcome("cpu-fail", f"{what} on CPU: {_first_line(e)}") from None


def _float64_grads(model, inputs):
    """The CPU model's gradients in float64: the reference that tells how far float32 itself is
    from the exact gradient."""
    model = copy.deepcopy(model).double().train()
    x = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    model(**x).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _as_accurate_as_cpu(got, cpu, exact):
    """A gradient that misses the float32 tolerance against CPU passes when CPU's float32 gradient
    is itself that far from the float64 one (ill-conditioned: batch norm over a tiny batch): neuron's
    error against float64 must be at most twice CPU's, plus the gradient tolerance."""
    if exact is None:
        return False
    got_err = (got.detach().cpu().double() - exact).abs().max().item()
    cpu_err = (cpu.detach().double() - exact).abs().max().item()
    return got_err <= 2 * cpu_err + GRAD_ATOL


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


class Arch:
    """One architecture of one table: the tiny CPU model, its neuron twin and the inputs."""

    def __init__(self, table, model_type, compiled=False):
        self.table, self.model_type, self.compiled = table, model_type, compiled
        self.checks = TABLES[table][1]

    def _neuron(self, model):
        """The neuron model as the check runs it: itself, or compiled with the neuron backend."""
        if not self.compiled:
            return model
        model.compile(backend="neuron")
        return model

    @functools.cached_property
    def built(self):
        import transformers
        auto_name, _, decoder = TABLES[self.table]
        auto = getattr(transformers, auto_name)

        def make():
            cfg = tiny.config_for(self.model_type, decoder)
            if self.table == "seq2seq" and getattr(cfg, "decoder_start_token_id", None) is None:
                cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
            with torch.device("meta"):
                n = sum(p.numel() for p in auto.from_config(cfg).parameters())
            if n > tiny.MAX_PARAMS:
                raise ValueError(f"the tiny config still has {n / 1e6:.0f}M parameters")
            torch.manual_seed(0)
            return cfg, tiny.prepare(self.model_type, auto.from_config(cfg))
        cfg, model = _cpu(make, "building the tiny model")
        if self.compiled:
            torch._dynamo.reset()  # one architecture's graphs and recompile budget at a time
        inputs = self._inputs(cfg)
        dev = copy.deepcopy(model).to(DEVICE)
        return cfg, model, dev, inputs

    def _inputs(self, cfg):
        g = torch.Generator().manual_seed(1)
        if self.table == "image-classification":
            vc = getattr(cfg, "vision_config", None) or cfg
            size = getattr(vc, "image_size", 32)
            size = size[0] if isinstance(size, (list, tuple)) else size
            ch = getattr(vc, "num_channels", 3)
            return {"pixel_values": torch.randn(BATCH, ch, size, size, generator=g),
                    "labels": torch.randint(0, max(cfg.num_labels, 1), (BATCH,), generator=g)}
        vocab = getattr(cfg.get_text_config(), "vocab_size", tiny.VOCAB) or tiny.VOCAB
        ids = torch.randint(4, min(vocab, tiny.VOCAB) - 4, (BATCH, SEQ), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}

    def cases(self):
        for check in self.checks:
            thunk = functools.partial(getattr(self, "check_" + check))
            # Compile mode: a check whose graphs the compiler refused (they ran eagerly) is its
            # own outcome, not a pass.
            yield check, counting_eager_graphs(thunk) if self.compiled else thunk

    def check_forward(self):
        _, cpu, dev, inputs = self.built
        cpu.eval()
        dev.eval()
        x = {k: v for k, v in inputs.items() if k != "labels"}
        if self.table == "seq2seq":
            x["decoder_input_ids"] = x["input_ids"][:, : SEQ // 2]
        with torch.no_grad():
            ref = _cpu(lambda: cpu(**x).logits, "forward")
            out = self._neuron(copy.deepcopy(dev))(**_to(x, DEVICE)).logits
        return assert_same(out, ref, "logits", check_strides=False, rtol=RTOL, atol=ATOL), None

    def check_train(self):
        _, cpu0, dev0, inputs = self.built
        cpu, dev = copy.deepcopy(cpu0).train(), self._neuron(copy.deepcopy(dev0).train())

        def step(model, x):
            loss = model(**x).loss
            loss.backward()
            grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
            # SGD: the update is linear in the gradient, so the parameters after the step are as
            # well-conditioned as the gradients (Adam's first step is lr * sign(grad) wherever the
            # gradient is ~0, turning rounding noise into lr-sized differences).
            opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
            opt.step()
            return loss.detach(), grads, dict(model.named_parameters())
        ref_loss, ref_grads, ref_params = _cpu(lambda: step(cpu, inputs), "training step")
        loss, grads, params = step(dev, _to(inputs, DEVICE))
        bitwise = assert_same(loss, ref_loss, "loss", rtol=RTOL, atol=ATOL)
        exact = None
        for n, g in ref_grads.items():
            if g is None and grads[n] is not None and self.compiled and not grads[n].any():
                continue  # AOTAutograd gives a parameter the forward did not use a zero gradient, not None
            if g is None or grads[n] is None:
                if (g is None) != (grads[n] is None):
                    raise AssertionError(f"grad of {n}: {'missing' if grads[n] is None else 'unexpected'} on neuron")
                continue
            try:
                bitwise &= assert_same(grads[n], g, f"grad of {n}", check_strides=False, rtol=GRAD_RTOL,
                                       atol=GRAD_ATOL)
            except AssertionError:
                if exact is None:
                    exact = _cpu(lambda: _float64_grads(cpu0, inputs), "float64 reference")
                if not _as_accurate_as_cpu(grads[n], g, exact.get(n)):
                    raise
                bitwise = False
        for n, p in ref_params.items():
            bitwise &= assert_same(params[n].detach(), p.detach(), f"{n} after SGD", check_strides=False,
                                   rtol=GRAD_RTOL, atol=GRAD_ATOL)
        return bitwise, None

    def check_generate(self):
        cfg, cpu, dev, inputs = self.built
        cpu.eval()
        dev.eval()
        kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True, return_dict_in_generate=True,
                  pad_token_id=getattr(cfg.get_text_config(), "pad_token_id", None) or 0)
        x = {k: v for k, v in inputs.items() if k != "labels"}
        ref = _cpu(lambda: cpu.generate(**x, **kw), "generate")
        out = self._neuron(copy.deepcopy(dev)).generate(**_to(x, DEVICE), **kw)
        a, e = out.sequences.cpu(), ref.sequences
        if torch.equal(a, e):
            return True, None
        if a.shape != e.shape:
            raise AssertionError(f"generated shape {tuple(a.shape)} vs CPU {tuple(e.shape)}")
        # A random tiny model can have near-equal top logits; a different pick there is not an error.
        start = e.shape[1] - len(ref.scores)
        step = int((a != e).any(0).nonzero()[0]) - start
        top2 = ref.scores[step].float().topk(2, dim=-1).values
        gap = float((top2[:, 0] - top2[:, 1]).min())
        if gap < 1e-3:
            return False, f"tokens diverge at step {step} where CPU's top-2 logits are {gap:.1e} apart (a tie)"
        raise AssertionError(f"generated tokens differ from CPU at step {step} (top-2 logit gap {gap:.3g})")
