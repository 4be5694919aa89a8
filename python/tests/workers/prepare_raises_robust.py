"""A prepare_fun that raises in robust mode, under `switchyard launch --max-restarts 1`:
rank 1's prepare_fun raises in its first life, before it writes anything, and the
exception ends that process. The call must run on no rank then: the survivors
recover, rank 1's second life prepares its input, and every rank prints the sum of
the prepared inputs (a result computed without rank 1's input would be missing it)."""
import os

import numpy as np

import switchyard

switchyard.init([], robust=True, timeout=30)
rank = switchyard.get_rank()
world = switchyard.get_world_size()
version, _ = switchyard.load_checkpoint()
a = np.zeros(4, dtype=np.float64)


def prepare(buf):
    if rank == 1 and os.environ.get("DMLC_NUM_ATTEMPT", "0") == "0":
        raise ValueError("prepare_fun raised on rank 1")
    buf[:] = rank + 1


switchyard.allreduce(a, switchyard.SUM, prepare_fun=prepare)
print("rank %d: result %s of %d" % (rank, a.tolist(), world), flush=True)
switchyard.finalize()
