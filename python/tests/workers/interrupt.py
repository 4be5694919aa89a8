"""Ctrl-C during an allreduce: run as three processes with torchrun's variables.
Rank 2 joins but never calls; ranks 0 and 1 wait in an allreduce; the test sends
SIGINT to rank 0, which must raise KeyboardInterrupt there and a SwitchyardError
naming rank 0 on rank 1, long before the 30 s timeout. Rank 0 then stays alive for a
while, so that rank 1's error comes from the interrupt, not from a closed connection."""
import sys
import time

import numpy as np

import switchyard

switchyard.init([], timeout=30)
rank = switchyard.get_rank()
if rank == 2:
    time.sleep(8)
    sys.exit(0)
a = np.ones(1 << 10)
print("rank %d: waiting" % rank, flush=True)
started = time.monotonic()
try:
    switchyard.allreduce(a, switchyard.SUM)
    print("rank %d: the allreduce returned" % rank, flush=True)
except KeyboardInterrupt:
    print("rank %d: KeyboardInterrupt after %.2f s" % (rank, time.monotonic() - started), flush=True)
    time.sleep(4)
except switchyard.SwitchyardError as e:
    print("rank %d: SwitchyardError after %.2f s: %s" % (rank, time.monotonic() - started, e), flush=True)
