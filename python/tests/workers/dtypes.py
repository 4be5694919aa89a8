"""Every supported dtype through every collective, checked against numpy on the
inputs every rank can compute for every other rank; float16 and bfloat16 (uint16
bits with dtype="bfloat16", and ml_dtypes.bfloat16 arrays where ml_dtypes is
installed) against float64 sums rounded once."""
import numpy as np

import switchyard

switchyard.init()
rank, world = switchyard.get_rank(), switchyard.get_world_size()
assert switchyard.is_distributed() == (world > 1)


def inputs(r, dtype, n=1000):
    return ((np.arange(n) * (r + 3)) % 97 + r).astype(dtype)


for dtype in (np.float32, np.float64, np.int32, np.int64, np.uint32, np.uint64, np.uint8):
    everyone = [inputs(r, dtype) for r in range(world)]
    for op, fold in ((switchyard.SUM, np.add), (switchyard.MAX, np.maximum), (switchyard.MIN, np.minimum)):
        a = inputs(rank, dtype)
        out = switchyard.allreduce(a, op)
        assert out is a
        expected = everyone[0].copy()
        for other in everyone[1:]:
            expected = fold(expected, other).astype(dtype)
        assert np.array_equal(a, expected), (dtype, op, a[:5], expected[:5])
    # 2-D arrays reduce as their flat memory.
    m = inputs(rank, dtype).reshape(10, 100)
    switchyard.allreduce(m, switchyard.MAX)
    assert m.shape == (10, 100)
    gathered = switchyard.allgather(inputs(rank, dtype))
    assert gathered.shape == (world, 1000) and gathered.dtype == dtype
    assert all(np.array_equal(gathered[r], everyone[r]) for r in range(world))
    block = switchyard.reduce_scatter(inputs(rank, dtype), switchyard.SUM)
    total = everyone[0].copy()
    for other in everyone[1:]:
        total = (total + other).astype(dtype)  # wraps like the integer sum does
    lo = 1000 // world * rank + min(rank, 1000 % world)
    assert np.array_equal(block, total[lo : lo + len(block)]), dtype

# float16 and bfloat16 sum in float32 and round once per element: 2048 + 1 + 1 is
# 2050 (numpy's float16 additions, rounding after each, give 2048); every other
# element is a sum that float32 holds exactly, so the correctly rounded float64 sum.
def to_bf16_bits(x):
    """float32 values that bfloat16 holds exactly, as their bfloat16 bits."""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


halves = [(inputs(r, np.float64, 999) - 40) / 8 for r in range(world)]
exact = np.sum(halves, axis=0)
first = [2048.0 if r == 0 else 1.0 for r in range(world)]
h = np.concatenate([[first[rank]], halves[rank]]).astype(np.float16)
assert switchyard.allreduce(h, switchyard.SUM) is h and h.dtype == np.float16
assert h[0] == np.float16(2048 + world - 1), h[0]
assert np.array_equal(h[1:], exact.astype(np.float16)), (h[1:6], exact[:5])
m = halves[rank].astype(np.float16)
switchyard.allreduce(m, switchyard.MAX)
assert np.array_equal(m, np.max(halves, axis=0).astype(np.float16))
first = [256.0 if r == 0 else 1.0 for r in range(world)]
# bfloat16 is spaced 2 apart from 256 on: the sum rounded once, half to even.
first_sum = np.round((256 + world - 1) / 2) * 2
b = to_bf16_bits(np.concatenate([[first[rank]], halves[rank]]))
switchyard.allreduce(b, switchyard.SUM, dtype="bfloat16")
assert from_bf16_bits(b)[0] == first_sum, from_bf16_bits(b)[0]
# Sums of up to 3 multiples of 1/8 below 32 have at most 8 significant bits.
assert np.array_equal(from_bf16_bits(b)[1:], exact.astype(np.float32))
block = switchyard.reduce_scatter(to_bf16_bits(halves[rank]), switchyard.SUM, dtype="bfloat16")
lo = 999 // world * rank + min(rank, 999 % world)
assert np.array_equal(from_bf16_bits(block), exact[lo : lo + len(block)].astype(np.float32))
block = switchyard.reduce_scatter(halves[rank].astype(np.float16), switchyard.SUM)
assert np.array_equal(block, exact[lo : lo + len(block)].astype(np.float16))
gathered = switchyard.allgather(halves[rank].astype(np.float16))
assert gathered.dtype == np.float16 and np.array_equal(gathered, np.array(halves).astype(np.float16))
try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None
if ml_dtypes is not None:
    a = np.concatenate([[first[rank]], halves[rank]]).astype(ml_dtypes.bfloat16)
    assert switchyard.allreduce(a, switchyard.SUM) is a and a.dtype == ml_dtypes.bfloat16
    assert a.astype(np.float32)[0] == first_sum
    assert np.array_equal(a.astype(np.float32)[1:], exact.astype(np.float32))
    gathered = switchyard.allgather(a)
    assert gathered.dtype == ml_dtypes.bfloat16 and gathered.shape == (world, 1000)
    assert all(np.array_equal(gathered[r], a) for r in range(world))
print("rank %d: halves ok (ml_dtypes %s)" % (rank, "yes" if ml_dtypes else "no"), flush=True)

ints = np.array([1 << rank], dtype=np.int64)
switchyard.allreduce(ints, switchyard.BITOR)
assert ints[0] == (1 << world) - 1
big = switchyard.broadcast(np.full(3 << 20, 7, dtype=np.uint8) if rank == 1 else None, 1)
assert big.nbytes == 3 << 20 and big.min() == 7 and big.flags.writeable
switchyard.barrier()
print("rank %d: dtypes ok" % rank, flush=True)
switchyard.finalize()
