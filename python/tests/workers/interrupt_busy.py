"""Ctrl-C while data moves: run as three processes with torchrun's variables. Every
rank runs 16 MiB allreduces back to back; the test sends SIGINT to rank 0 once it
says it is moving data. Rank 0 must raise KeyboardInterrupt at once, the others a
SwitchyardError naming rank 0, long before the 30 s timeout. Rank 0 then stays
alive for a while, so that the others' errors come from the interrupt, not from a
closed connection. (A SIGINT that lands between two calls raises in Python's own
code, where no call can tell the peers; rank 0 then says so and exits at once, and
the peers see its connections close.)"""
import time

import numpy as np

import switchyard

switchyard.init([], timeout=30)
rank = switchyard.get_rank()
a = np.ones(4 << 20, dtype=np.float32)
switchyard.allreduce(a, switchyard.SUM)
print("rank %d: moving" % rank, flush=True)
started = time.monotonic()
inside = False
try:
    for _ in range(2000):
        inside = True
        switchyard.allreduce(a, switchyard.SUM)
        inside = False
        a[:] = 1.0
    print("rank %d: every allreduce returned" % rank, flush=True)
except KeyboardInterrupt:
    where = "inside" if inside else "outside"
    print("rank %d: KeyboardInterrupt %s a call at %.2f s" % (rank, where, time.monotonic() - started), flush=True)
    if inside:
        time.sleep(4)
except switchyard.SwitchyardError as e:
    print("rank %d: SwitchyardError at %.2f s: %s" % (rank, time.monotonic() - started, e), flush=True)
