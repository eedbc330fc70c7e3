"""Gen-2 instructions of the Scalar, Vector and GpSimd Engines that NKI 0.6 added: ``exponential``
and ``activate2`` (NeuronCore-v4), and the engines' random number generators (``rng``, ``rand2``,
``set_rng_seed``, ``rand_set_state``, ``rand_get_state``)."""
from __future__ import annotations

import torch

from ... import isa as _g1
from ... import language as _nl
from ..._emit import issue, new_tensor
from ..._tensor import PSUM, SBUF, as_view, is_tile

_INTS = (torch.int8, torch.int16, torch.int32, torch.uint8, torch.uint16, torch.uint32)


def _per_partition(x, P, scale=1.0):
    """A (P, 1) fp32 tile holding ``x * scale`` (a constant, or a (P, 1) tile)."""
    t = new_tensor((P, 1), torch.float32)
    if is_tile(x):
        _g1.tensor_scalar(x, _nl.multiply, float(scale), _dst=t)
    else:
        issue("fill", "memset", as_view(t), scalars=[float(x) * scale])
    return t


def exponential(dst, src, max_value=0.0, reduce_res=None, reduce_cmd=None, reduce_init=0.0, name=None):
    """``dst = exp(src - max_value)`` on the Vector Engine (fp32 inside); with ``reduce_cmd`` the
    per-partition sums go through the Vector Engine's reduction registers into ``reduce_res``."""
    from . import reduce_cmd as _cmd
    cmd = _cmd.idle if reduce_cmd is None else reduce_cmd
    s = as_view(src)
    P = s.sizes[0]
    init = None
    if int(getattr(cmd, "value", cmd)) == _cmd.load_reduce.value:
        init = _per_partition(reduce_init, P)
    elif is_tile(reduce_init) or float(reduce_init) != 0.0:
        raise ValueError("exponential: reduce_init is used only with reduce_cmd=load_reduce; leave it 0.0")
    _g1.activation(_nl.exp, src, bias=_per_partition(max_value, P, -1.0), reduce_op=_nl.add, reduce_res=reduce_res,
                   reduce_cmd=cmd, dtype=as_view(dst).tdtype, _dst=dst, _name="exponential", _vector_regs=True,
                   _reduce_init=init)


_STAGES = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
           ("subtract", "bypass"), ("bypass", "bypass")}


def activate2(dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, reverse1=False, reduce_op=None,
              reduce_res=None, reduce_cmd=None, name=None):
    """``op((data op0 imm0) op1 imm1)`` on the Scalar Engine (fp32 inside), with an optional
    reduction through its registers; ``nl.bypass`` skips a stage."""
    from . import reduce_cmd as _cmd
    names = tuple(getattr(o, "__name__", str(o)) if o is not None else "bypass" for o in (op0, op1))
    if names not in _STAGES:
        raise ValueError(f"activate2: (op0, op1) = {names} is not one of the supported pairs {sorted(_STAGES)}")
    v = as_view(data)
    P = v.sizes[0]
    x = data
    if names != ("bypass", "bypass"):
        x = new_tensor(tuple(v.sizes), torch.float32)  # fp32, as the engine's pipeline
        _g1.tensor_scalar(data, op0 if names[0] != "bypass" else _nl.add, imm0 if names[0] != "bypass" else 0.0,
                          reverse0, None if names[1] == "bypass" else op1, None if names[1] == "bypass" else imm1,
                          reverse1, _dst=x)
    if is_tile(relu_param):
        raise NotImplementedError("activate2: a per-partition relu_param tile is not supported yet; pass a constant")
    _g1.activation(op, x, reduce_op=reduce_op, reduce_res=reduce_res,
                   reduce_cmd=_cmd.idle if reduce_cmd is None else reduce_cmd, dtype=as_view(dst).tdtype, _dst=dst,
                   _name="activate2", _alpha=float(relu_param))


def _prng(op, dst, engine, srcs=(), scalars=(), has_tiles=0, name="rng"):
    e = 1 if getattr(engine, "name", engine) == "gpsimd" else 0
    issue("prng", name, as_view(dst), list(srcs), scalars=list(scalars), ints=[op, e, has_tiles], same_shape=False,
          roles=["dst"] + [f"src{i}" for i in range(len(srcs))])


def rng(dst, engine=None, name=None):
    """32 random bits per element of integer ``dst`` (its low bits for narrower types)."""
    d = as_view(dst)
    if d.tdtype not in _INTS:
        raise TypeError(f"rng dst must be an integer type (int8..uint32), got {d.dtype}")
    if getattr(engine, "name", "") == "gpsimd" and d.space == PSUM:
        raise TypeError("rng on the GpSimd Engine cannot write PSUM; use the Vector Engine or an SBUF dst")
    _prng(0, dst, engine, name="rng")


def rand2(dst, min, max, name=None):  # noqa: A002 - NKI's parameter names
    """Uniform random values in [min, max] (constants or (P, 1) tiles) on the Vector Engine."""
    d = as_view(dst)
    if is_tile(min) or is_tile(max):
        P = d.sizes[0]
        lo = min if is_tile(min) else _per_partition(min, P)
        hi = max if is_tile(max) else _per_partition(max, P)
        _prng(1, dst, "vector", [as_view(lo), as_view(hi)], has_tiles=1, name="rand2")
    else:
        _prng(1, dst, "vector", scalars=[float(min), float(max)], name="rand2")


def set_rng_seed(src_seeds, name=None):
    """Seeds every lane of the Vector Engine's generator from a [1, 1] 32-bit tile."""
    s = as_view(src_seeds)
    if s.space not in (SBUF, PSUM) or s.tdtype.itemsize != 4 or s.sizes[0] * (s.sizes[-1] if s.sizes else 1) != 1:
        raise ValueError(f"set_rng_seed src_seeds must be a [1, 1] 32-bit SBUF/PSUM tile, got {tuple(s.sizes)} {s.dtype}")
    _prng(2, s, "vector", name="set_rng_seed")


def rand_set_state(src_seeds, engine=None, name=None):
    """Each partition's lanes take the XORWOW state in its row of uint32 (6 words; the Vector
    Engine's four lanes: 24)."""
    s = as_view(src_seeds)
    if s.space != SBUF or s.tdtype != torch.uint32:
        raise TypeError(f"rand_set_state src_seeds must be a uint32 SBUF tile, got {s.dtype} in {s.buffer_space}")
    _prng(3, s, "gpsimd" if engine is None else engine, name="rand_set_state")


def rand_get_state(dst, engine=None, name=None):
    """Writes each partition's lanes' XORWOW state (6 uint32, or 24 on the Vector Engine) to dst."""
    d = as_view(dst)
    if d.tdtype != torch.uint32:
        raise TypeError(f"rand_get_state dst must be uint32, got {d.dtype}")
    _prng(4, dst, "gpsimd" if engine is None else engine, name="rand_get_state")
