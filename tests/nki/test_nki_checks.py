"""Every hardware limit the simulated NeuronCore checks raises its message, naming the
instruction, the operand and the limit; capacity overflows name the kernel line."""
import numpy as np
import pytest

from torch_neuronx import nki
import torch_neuronx.nki.isa as nisa
import torch_neuronx.nki.language as nl


def run(body, *arrays):
    k = nki.jit(body)
    return nki.simulate_kernel(k, *(arrays or (np.zeros((256, 1024), np.float32),)))


def raises(body, exc, match, *arrays):
    with pytest.raises(exc, match=match):
        run(body, *arrays)


def test_partition_dimension_over_128():
    def k(a):
        x = nl.load(a[0:128, 0:512])
        big = nl.ndarray((128, 512), nl.float32)
        nisa.tensor_tensor(x, x, nl.add)
        nisa.tensor_tensor(nl.ndarray((256, 64), nl.float32, buffer=nl.sbuf), x, nl.add)
    raises(k, ValueError, "partition dimension 256 exceeds maximum 128")


def test_tensor_tensor_operands_mismatch_and_psum_pair():
    def mismatch(a):
        x = nl.load(a[0:128, 0:512])
        y = nl.load(a[0:64, 0:512])
        nisa.tensor_tensor(x, y, nl.add)
    raises(mismatch, ValueError, r"number of partitions .* mismatch in parameters \(data1\[128, 512\], data2\[64, 512\]\)")

    def both_psum(a):
        p = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        q = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        nisa.tensor_tensor(p, q, nl.multiply)
    raises(both_psum, ValueError, "tensor_tensor data1 and data2 cannot both be in PSUM")


def test_matmul_limits():
    def stationary_too_wide(a):
        s = nl.load(a[0:128, 0:256])
        m = nl.load(a[0:128, 0:512])
        nisa.nc_matmul(s, m)
    raises(stationary_too_wide, ValueError, "nc_matmul stationary free dimension 256 exceeds maximum 128")

    def moving_too_wide(a):
        s = nl.load(a[0:128, 0:128])
        m = nl.load(a[0:128, 0:1024])
        nisa.nc_matmul(s, m)
    raises(moving_too_wide, ValueError, "nc_matmul moving free dimension 1024 exceeds maximum 512")

    def contraction_mismatch(a):
        s = nl.load(a[0:128, 0:128])
        m = nl.load(a[0:64, 0:512])
        nisa.nc_matmul(s, m)
    raises(contraction_mismatch, ValueError, "stationary and moving must have the same partition dimension")

    def fp32_with_bf16(a):
        s = nl.load(a[0:128, 0:128])
        m = nl.load(a[0:128, 0:512], dtype=nl.bfloat16)
        nisa.nc_matmul(s, m)
    raises(fp32_with_bf16, ValueError, "fp32 operands pair only with fp32")

    def from_hbm(a):
        m = nl.load(a[0:128, 0:512])
        nisa.nc_matmul(a[0:128, 0:128], m)
    raises(from_hbm, TypeError, "Expected operand 'stationary' of 'nc_matmul' to be in address space 'sbuf', "
                                "but got a tile in 'hbm'")


def test_gen2_matmul_output_must_be_psum():
    import torch_neuronx.nki.v2 as nki2
    import torch_neuronx.nki.v2.isa as nisa2
    import torch_neuronx.nki.v2.language as nl2

    @nki2.jit
    def k(a):
        s = nl2.ndarray((128, 128), nl2.float32, buffer=nl2.sbuf)
        nisa2.dma_copy(dst=s, src=a[0:128, 0:128])
        d = nl2.ndarray((128, 128), nl2.float32, buffer=nl2.sbuf)
        nisa2.nc_matmul(d, s, s)
    with pytest.raises(TypeError, match=r"nc_matmul dst must be in \['psum'\], got sbuf"):
        nki2.simulate(k)(np.zeros((128, 128), np.float32))


def test_transpose_limits():
    def pe(a):
        nisa.nc_transpose(nl.load(a[0:128, 0:256]), engine=nisa.tensor_engine)
    raises(pe, ValueError, "nc_transpose data free dimension 256 exceeds maximum 128")

    def vector(a):
        nisa.nc_transpose(nl.load(a[0:64, 0:32]), engine=nisa.vector_engine)
    raises(vector, ValueError, "nc_transpose data partition dimension 64 exceeds maximum 32")

    def language(a):
        nl.transpose(nl.load(a[0:128, 0:200]))
    raises(language, ValueError, r"size of dimension 1 in 'x\[128, 200\]' of 'transpose' exceed architecture limitation of 128")


def test_psum_tile_larger_than_a_bank():
    def k(a):
        nl.zeros((128, 1024), nl.float32, buffer=nl.psum)
    raises(k, ValueError, "a PSUM tile must fit one 2048-byte bank")


def test_out_of_bounds_access_without_mask_and_with_mask():
    def oob(a):
        i_p, i_f = nl.mgrid[0:128, 0:512]
        nl.load(a[200 + i_p, i_f])
    raises(oob, IndexError, "out-of-bounds access: index 327 of dimension 0")

    def masked(a):
        i_p, i_f = nl.mgrid[0:128, 0:512]
        t = nl.load(a[200 + i_p, i_f], mask=(200 + i_p < 256))
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=t)
        return out
    a = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
    out = run(masked, a)
    assert np.array_equal(out[:56], a[200:256, :512]) and np.isnan(out[56:]).all()


def test_operand_in_wrong_memory():
    def k(a):
        t = nl.load(a[0:128, 0:512])
        nl.load(t)
    raises(k, TypeError, "Expected operand 'src' of 'load' to be in address space 'hbm', but got a tile in 'sbuf'")

    def exp_on_hbm(a):
        nl.exp(a)
    raises(exp_on_hbm, TypeError, "Expected operand 'x' of 'exp' to be in address space 'sbuf|psum'")


def test_reduce_along_partitions_is_rejected():
    def k(a):
        nisa.tensor_reduce(nl.add, nl.load(a[0:128, 0:512]), axis=0)
    raises(k, ValueError, "axis 0 is the partition dimension")


def test_sbuf_and_psum_capacity():
    def sbuf(a):
        keep = [nl.zeros((128, 16384), nl.float32) for _ in range(4)]  # 64 KiB per partition each
        nl.add(nl.add(keep[0], keep[1]), nl.add(keep[2], keep[3]))  # all four live at once
    with pytest.raises(MemoryError, match=r"SBUF allocation of 't4' \[128, 16384\] float32 \(at .*test_nki_checks.py:"
                                          r"\d+\) does not fit: 65536 bytes per partition requested, 32768 of "
                                          r"229376 bytes per partition free"):
        run(sbuf)

    def psum(a):
        banks = [nl.zeros((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        for b in banks:
            nl.copy(b)
    with pytest.raises(MemoryError, match="PSUM allocation .* 0 of 16384 bytes per partition free"):
        run(psum)


def test_tiles_are_placed_by_lifetime():
    def k(a):
        # 8 x 64 KiB tiles in sequence: each is dead after its last use, so they share memory
        out = nl.ndarray((128, 16384), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 16384), nl.float32)
        for i in range(8):
            t = nl.full((128, 16384), float(i), nl.float32)
            acc[...] = nl.add(acc, t)
        nl.store(out, value=acc)
        return out
    kern = nki.jit(k)
    out = kern(np.zeros((1,), np.float32))
    assert (out == 28).all()
    assert kern.last_trace_stats.program.sbuf_peak == 2 * 65536  # acc and t (the add writes acc itself)


def test_tiles_freed_in_a_loop_do_not_exhaust_sbuf():
    def k(a):
        out = nl.ndarray((128, 1024), nl.float32, buffer=nl.shared_hbm)
        for i in nl.sequential_range(64):  # 64 x 2 x 4 KiB per partition: only live tiles count
            x = nl.load(a[0:128, 0:1024])
            nl.store(out, value=nl.add(x, 1.0))
        return out
    a = np.random.rand(256, 1024).astype(np.float32)
    assert np.allclose(run(k, a), a[:128] + 1)


def test_trn1_target_has_smaller_sbuf(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    def k(a):
        keep = [nl.zeros((128, 16384), nl.float32) for _ in range(3)]  # 192 KiB fits trn1 exactly
        more = nl.zeros((128, 16), nl.float32)
        for t in keep + [more]:
            nl.copy(t)
    with pytest.raises(MemoryError, match="0 of 196608 bytes per partition free"):
        run(k)
    assert nisa.get_nc_version() == nisa.nc_version.gen2


def test_unknown_target_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE=trn9 is not a NeuronCore target"):
        run(lambda a: None)


def test_nan_fill_exposes_a_read_of_unwritten_memory():
    def k(a):
        out = nl.ndarray((128, 64), nl.float32, buffer=nl.shared_hbm)
        t = nl.ndarray((128, 64), nl.float32)
        t[:, 0:32] = nl.load(a[0:128, 0:32])
        nl.store(out, value=t)
        i = nl.ndarray((128, 8), nl.int32)
        out_i = nl.ndarray((128, 8), nl.int32, buffer=nl.shared_hbm)
        nl.store(out_i, value=i)
        return out, out_i
    out, out_i = run(k, np.ones((128, 64), np.float32))
    assert (out[:, :32] == 1).all() and np.isnan(out[:, 32:]).all()
    assert (out_i == 4).all()  # ints: AWS's simulator's sentinel


def test_a_failed_kernel_leaves_the_device_usable():
    import torch

    def bad(a):
        nisa.nc_matmul(nl.load(a[0:128, 0:256]), nl.load(a[0:128, 0:512]))
    with pytest.raises(ValueError):
        nki.jit(bad)(torch.zeros(256, 1024, device="neuron"))
    x = torch.ones(4, device="neuron")
    assert (x + 1).cpu().tolist() == [2, 2, 2, 2]


def test_affine_range_iterations_writing_one_element_collide():
    def collide(a):
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        for i in nl.affine_range(4):
            x = nl.load(a[0:128, 0:512])
            nl.store(out[0:128, 0:512], value=nl.add(x, float(i)))  # every iteration writes all of out
        return out
    raises(collide, ValueError, r"affine_range iterations 0 and 1 both write .*must be independent; use "
                                r"sequential_range")

    def sequential(a):  # the same loop, declared dependent: last iteration wins
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        for i in nl.sequential_range(4):
            nl.store(out[0:128, 0:512], value=nl.add(nl.load(a[0:128, 0:512]), float(i)))
        return out
    a = np.random.rand(256, 1024).astype(np.float32)
    assert np.allclose(run(sequential, a), a[:128, :512] + 3)

    def allowed(a):  # disjoint slices, accumulation, loop-local tiles and manually aliased blocks
        out = nl.ndarray((128, 512), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        buf = nl.ndarray((2, nl.par_dim(128), 128), nl.float32,
                         buffer=nl.sbuf.mod_alloc(base_addr=0, num_free_tiles=(1,)))
        for k in nl.affine_range(2):
            lhs = nl.load(a[k * 128:(k + 1) * 128, 0:128])
            acc += nisa.nc_matmul(lhs, nl.load(a[k * 128:(k + 1) * 128, 0:512]))
            buf[k] = nl.load(a[0:128, k * 128:(k + 1) * 128])
            nl.store(out[0:128, k * 128:(k + 1) * 128], value=buf[k])
        nl.store(out[0:128, 256:512], value=nl.copy(acc[0:128, 256:512]))
        return out
    out = run(allowed, a)
    assert np.allclose(out[:, :256], a[:128, :256])
    ref = a[0:128, 0:128].T @ a[0:128, 0:512] + a[128:256, 0:128].T @ a[128:256, 0:512]
    assert np.allclose(out[:, 256:], ref[:, 256:], rtol=1e-4)


def test_memory_is_taken_at_first_use_not_at_the_allocation_statement():
    def k(a):
        # 8 x 64 KiB tiles made up front (512 KiB > one partition's 224 KiB), each used and dead in turn
        out = nl.ndarray((128, 16384), nl.float32, buffer=nl.shared_hbm)
        tiles = [nl.ndarray((128, 16384), nl.float32, buffer=nl.sbuf) for _ in range(8)]
        acc = nl.zeros((128, 16384), nl.float32)
        for i, t in enumerate(tiles):
            t[...] = nl.full((128, 16384), float(i), nl.float32)
            acc[...] = nl.add(acc, t)
        nl.store(out, value=acc)
        return out
    kern = nki.jit(k)
    assert (kern(np.zeros((1,), np.float32)) == 28).all()
    assert kern.last_trace_stats.program.sbuf_peak <= 3 * 65536
