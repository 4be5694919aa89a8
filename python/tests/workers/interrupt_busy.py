"""Ctrl-C while data moves: run as three processes with torchrun's variables. Every
rank runs 16 MiB allreduces back to back; the test sends SIGINT to rank 0 once it
says it is moving data. Rank 0 must raise KeyboardInterrupt at once, the others a
SwitchyardError naming rank 0, long before the 30 s timeout. Rank 0 then stays
alive for a while, so that the others' errors come from the interrupt, not from a
closed connection."""
import time

import numpy as np

import switchyard

switchyard.init([], timeout=30)
rank = switchyard.get_rank()
a = np.ones(4 << 20, dtype=np.float32)
switchyard.allreduce(a, switchyard.SUM)
print("rank %d: moving" % rank, flush=True)
started = time.monotonic()
try:
    for _ in range(2000):
        switchyard.allreduce(a, switchyard.SUM)
        a[:] = 1.0
    print("rank %d: every allreduce returned" % rank, flush=True)
except KeyboardInterrupt:
    print("rank %d: KeyboardInterrupt at %.2f s" % (rank, time.monotonic() - started), flush=True)
    time.sleep(4)
except switchyard.SwitchyardError as e:
    print("rank %d: SwitchyardError at %.2f s: %s" % (rank, time.monotonic() - started, e), flush=True)
