"""Every supported dtype through every collective, checked against numpy on the
inputs every rank can compute for every other rank."""
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

ints = np.array([1 << rank], dtype=np.int64)
switchyard.allreduce(ints, switchyard.BITOR)
assert ints[0] == (1 << world) - 1
big = switchyard.broadcast(np.full(3 << 20, 7, dtype=np.uint8) if rank == 1 else None, 1)
assert big.nbytes == 3 << 20 and big.min() == 7 and big.flags.writeable
switchyard.barrier()
print("rank %d: dtypes ok" % rank, flush=True)
switchyard.finalize()
