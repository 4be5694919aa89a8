"""A prepare_fun that raises: run as three processes with torchrun's variables.
Rank 1's prepare_fun raises ValueError; every rank prints how its allreduce ended.
The call must run on no rank: rank 1 raises the ValueError, ranks 0 and 2 a
SwitchyardError naming rank 1 and "prepare failed", well before the 30 s timeout."""
import sys
import time

import numpy as np

import switchyard

switchyard.init([], timeout=30)
rank = switchyard.get_rank()
a = np.zeros(int(sys.argv[1]), dtype=np.float32)


def prepare(buf):
    buf[:] = 1.0
    if rank == 1:
        raise ValueError("no input on rank 1")


started = time.monotonic()
try:
    switchyard.allreduce(a, switchyard.SUM, prepare_fun=prepare)
    print("rank %d: the allreduce returned %s" % (rank, a[:3].tolist()), flush=True)
except ValueError as e:
    print("rank %d: ValueError after %.2f s: %s" % (rank, time.monotonic() - started, e), flush=True)
except switchyard.SwitchyardError as e:
    print("rank %d: SwitchyardError after %.2f s: %s" % (rank, time.monotonic() - started, e), flush=True)
