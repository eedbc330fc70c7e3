"""Manual placement (Gen-1 ``ncc.*.mod_alloc``/``alloc``, Gen-2 ``nl.ndarray(address=)``) puts
tensors where the kernel says, sharing memory as hardware does; an instruction's result assigned
to a tensor is written there directly (no temporary), as the NKI compiler does."""
import functools

import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.compiler as ncc
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl
from torch_neuronx.nki.language import par_dim


def test_modulo_blocks_share_memory():
    # 4 blocks on 2 physical tiles: block 2 is block 0's memory, so writing it overwrites block 0
    @nki.jit
    def k(a):
        out = nl.ndarray((4, 128, 64), nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((4, par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=1024,
                                                                                       num_free_tiles=(2,)))
        for i in nl.affine_range(4):
            buf[i] = nl.load(a[i])
        for i in nl.affine_range(4):
            nl.store(out[i], value=buf[i])
        return out
    a = np.random.rand(4, 128, 64).astype(np.float32)
    out = nki.simulate_kernel(k, a)
    assert np.array_equal(out[2], a[2]) and np.array_equal(out[3], a[3])
    assert np.array_equal(out[0], a[2]) and np.array_equal(out[1], a[3])  # overwritten, as on hardware


def test_modulo_allocation_with_enough_tiles_keeps_every_block():
    @nki.jit
    def k(a):
        out = nl.ndarray((4, 128, 64), nl.float32, buffer=nl.shared_hbm)
        buf = nl.ndarray((4, par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0,
                                                                                       num_free_tiles=(4,)))
        for i in nl.affine_range(4):
            buf[i] = nl.load(a[i])
        nl.store(out[1:3], value=buf[1:3])  # an access across evenly spaced blocks
        nl.store(out[0], value=buf[0])
        nl.store(out[3], value=buf[3])
        return out
    a = np.random.rand(4, 128, 64).astype(np.float32)
    assert np.array_equal(nki.simulate_kernel(k, a), a)


def test_two_tensors_at_one_address_alias():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=4096))
        y = nl.ndarray((par_dim(128), 64), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=4096))
        x[...] = nl.load(a)
        y[...] = nl.add(x, 1.0)   # in place over x
        nl.store(out, value=x)    # reads y's values
        return out
    a = np.random.rand(128, 64).astype(np.float32)
    assert np.allclose(nki.simulate_kernel(k, a), a + 1)


def test_alloc_function_called_with_keywords_and_psum_banks():
    # the allocation function gets idx=, pdim_size=, fdim_size= (kernels bind other args with partial)
    seen = []

    def place(bank_of, idx, pdim_size, fdim_size):
        seen.append((idx, pdim_size, fdim_size))
        return (bank_of[idx], 0, 0)

    @nki.jit
    def k(a, b):
        out = nl.ndarray((2, 128, 512), nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        acc = nl.ndarray((2, par_dim(128), 512), nl.float32,
                         buffer=ncc.psum.alloc(functools.partial(place, bank_of={(0,): 3, (1,): 6})))
        for i in nl.affine_range(2):
            acc[i] += nisa.nc_matmul(x, y)
            acc[i] += nisa.nc_matmul(x, y)
            nl.store(out[i], value=nl.copy(acc[i]))
        return out
    a = np.random.rand(128, 128).astype(np.float32)
    b = np.random.rand(128, 512).astype(np.float32)
    out = nki.simulate_kernel(k, a, b)
    assert np.allclose(out, np.stack([2 * a.T @ b] * 2), rtol=1e-4)
    assert seen == [((0,), 128, 2048), ((1,), 128, 2048)]


def test_every_psum_bank_placed_by_hand_leaves_no_room_for_temporaries():
    # 8 banks taken: `psum[...] = nc_matmul(...)` and `psum += nc_matmul(...)` must write the bank
    # itself (a temporary would need a ninth bank)
    @nki.jit
    def k(a, b):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        banks = nl.ndarray((8, par_dim(128), 512), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=0,
                                                                                          num_bank_tiles=(8,)))
        for i in nl.affine_range(8):
            banks[i] = nisa.nc_matmul(x, y)
        banks[0] += nisa.nc_matmul(x, y)
        res = nl.ndarray((par_dim(128), 512), nl.float32)
        res[...] = nl.add(banks[0], nl.copy(banks[7]))
        nl.store(out, value=res)
        return out
    a = np.random.rand(128, 128).astype(np.float32)
    b = np.random.rand(128, 512).astype(np.float32)
    assert np.allclose(k(a, b), 3 * a.T @ b, rtol=1e-4)
    assert k.last_trace_stats.program.psum_peak == 16384


def test_addresses_computed_in_an_affine_loop_body_are_taken_once():
    # NKI traces an affine_range body once, so `addr += size` in it runs once: every iteration's
    # tensor lands at the first iteration's address (here 3 x 64 KiB, which would not fit 16 times)
    @nki.jit
    def k(a):
        out = nl.ndarray((16, 128, 16384), nl.float32, buffer=nl.shared_hbm)
        addr = 0
        for i in nl.affine_range(16):
            x = nl.ndarray((par_dim(128), 16384), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=addr))
            addr += 16384 * 4
            x[...] = nl.load(a[i])
            nl.store(out[i], value=x)
        return out
    a = np.random.rand(16, 128, 16384).astype(np.float32)
    assert np.array_equal(nki.simulate_kernel(k, a), a)


def test_placement_outside_the_memory_is_an_error():
    @nki.jit
    def k(a):
        x = nl.ndarray((par_dim(128), 1024), nl.float32, name="x",
                       buffer=ncc.sbuf.mod_alloc(base_addr=229376 - 1024))
        x[...] = nl.load(a[0:128, 0:1024])
    with pytest.raises(ValueError, match=r"'x'.* bytes \[228352, 232448\) exceed the 229376 bytes of a partition"):
        nki.simulate_kernel(k, np.zeros((128, 1024), np.float32))

    @nki.jit
    def crosses_bank(a):
        nl.ndarray((par_dim(128), 512), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=0, base_addr=1024))
    with pytest.raises(ValueError, match="cross a 2048-byte PSUM bank boundary"):
        nki.simulate_kernel(crosses_bank, np.zeros((1,), np.float32))

    @nki.jit
    def partitions(a):
        nl.ndarray((par_dim(128), 4), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0, base_partition=64))
    with pytest.raises(ValueError, match=r"partitions \[64, 192\) exceed the 128 partitions"):
        nki.simulate_kernel(partitions, np.zeros((1,), np.float32))


def test_auto_allocation_goes_around_manual_placement():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        pinned = nl.ndarray((par_dim(128), 512), nl.float32, buffer=ncc.sbuf.mod_alloc(base_addr=0))
        pinned[...] = nl.load(a)
        t = nl.multiply(pinned, 2.0)   # auto-placed, must not land on `pinned`
        u = nl.add(t, pinned)
        nl.store(out, value=u)
        return out
    a = np.random.rand(128, 512).astype(np.float32)
    assert np.allclose(nki.simulate_kernel(k, a), 3 * a)


def test_gen2_address_places_and_aliases():
    import torch_neuronx.nki.v2.isa as nisa2
    import torch_neuronx.nki.v2.language as nl2

    @nki.jit
    def k(a):
        out = nl2.ndarray(a.shape, a.dtype, buffer=nl2.shared_hbm)
        x = nl2.ndarray((128, 256), nl2.float32, buffer=nl2.sbuf, address=(0, 8192))
        y = nl2.ndarray((128, 256), nl2.float32, buffer=nl2.sbuf, address=(0, 8192))
        nisa2.dma_copy(dst=x, src=a)
        nisa2.tensor_scalar(dst=y, data=y, op0=nl2.multiply, operand0=3.0)  # y is x
        p = nl2.ndarray((128, 256), nl2.float32, buffer=nl2.psum, address=(0, 5 * 2048))
        nisa2.tensor_copy(dst=p, src=x)
        z = nl2.ndarray((128, 256), nl2.float32, buffer=nl2.sbuf)
        nisa2.tensor_copy(dst=z, src=p)
        nisa2.dma_copy(dst=out, src=z)
        return out
    a = np.random.rand(128, 256).astype(np.float32)
    assert np.allclose(k(a), 3 * a)


def test_an_assigned_result_is_written_in_place_unless_still_held():
    @nki.jit
    def k(a):
        out = nl.ndarray((128, 16384), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 16384), nl.float32)
        for i in range(8):
            acc[...] = nl.add(acc, float(i))   # written into acc: no 64 KiB temporary
        nl.store(out, value=acc)
        return out
    out = k(np.zeros((1,), np.float32))
    assert (out == 28).all()
    assert k.last_trace_stats.program.sbuf_peak == 65536

    @nki.jit
    def held(a):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        x = nl.ndarray((128, 64), nl.float32)
        t = nl.load(a)       # still held after the assignment: copied, t stays its own tile
        x[...] = t
        x[...] = nl.add(x, 1.0)
        nl.store(out[0], value=t)
        nl.store(out[1], value=x)
        return out
    a = np.random.rand(128, 64).astype(np.float32)
    out = nki.simulate_kernel(held, a)
    assert np.array_equal(out[0], a) and np.allclose(out[1], a + 1)


def test_static_cast_and_gen1_identity():
    assert nl.static_cast(np.ones(3), np.float16).dtype == np.float16
    assert nl.static_cast(np.ones(3), nl.bfloat16).dtype == nl.bfloat16

    @nki.jit
    def k(a):
        out = nl.ndarray((128, 128), nl.float32, buffer=nl.shared_hbm)
        ident = nl.shared_identity_matrix(n=128, dtype=nl.float32)  # in shared HBM: loaded
        x = nl.load(a)
        nl.store(out, value=nl.copy(nisa.nc_matmul(nl.load(ident), x)))
        return out
    a = np.random.rand(128, 128).astype(np.float32)
    assert np.allclose(nki.simulate_kernel(k, a), a, rtol=1e-5)


def test_buffers_reused_across_an_unrolled_loop_take_memory_per_value():
    """Two 120 KB-per-partition buffers made before a loop do not fit together in SBUF (224 KiB), but
    as the NKI compiler places them they need not: each whole write starts a new value placed by
    its own lifetime, and an elementwise result may take the memory of the source dying there."""
    import torch_neuronx.nki.v2.isa as nisa2
    import torch_neuronx.nki.v2.language as nl2
    F = 30000

    @nki.jit
    def k(x):
        out = nl2.ndarray(x.shape, x.dtype, buffer=nl2.shared_hbm)
        buf = nl2.ndarray((128, F), x.dtype, buffer=nl2.sbuf)
        res = nl2.ndarray((128, F), x.dtype, buffer=nl2.sbuf)
        for i in range(x.shape[0]):
            nisa2.dma_copy(dst=buf, src=x[i])
            nisa2.tensor_scalar(dst=res, data=buf, op0=nl2.multiply, operand0=float(i + 1))
            nisa2.activation(dst=res, op=nl2.exp, data=res, scale=1e-3)  # in place: reads res
            nisa2.dma_copy(dst=out[i], src=res)
        return out
    x = np.random.default_rng(0).standard_normal((3, 128, F)).astype(np.float32)
    out = k(x)
    want = np.exp(x * np.arange(1, 4, dtype=np.float32)[:, None, None] * 1e-3)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert k.last_trace_stats.program.sbuf_peak <= 120064 + 1024  # one buffer's worth (+ small tiles)

    @nki.jit
    def both_read_later(x):  # buf is read after res is made: they must coexist, and do not fit
        out = nl2.ndarray(x.shape, x.dtype, buffer=nl2.shared_hbm)
        buf = nl2.ndarray((128, F), x.dtype, buffer=nl2.sbuf)
        res = nl2.ndarray((128, F), x.dtype, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=buf, src=x[0])
        nisa2.tensor_scalar(dst=res, data=buf, op0=nl2.multiply, operand0=2.0)
        nisa2.tensor_tensor(dst=res, data1=res, data2=buf, op=nl2.add)
        nisa2.dma_copy(dst=out[0], src=res)
        return out
    with pytest.raises(MemoryError, match="does not fit"):
        both_read_later(x)
