"""rabit's broadcast.py: a dict from rank 0, plus a large array out of band."""
import numpy as np

import switchyard

switchyard.init()
rank = switchyard.get_rank()
s = None
if rank == 0:
    s = {"hello world": 100, 2: 3, "weights": np.arange(1 << 18, dtype=np.float32)}
s = switchyard.broadcast(s, 0)
w = s.pop("weights")
assert w.flags.writeable and w.dtype == np.float32, w.flags
print("@node[%d] after-broadcast: s=%s weights=%d sum=%.1f" % (rank, sorted(s.items(), key=str), len(w), w.sum()))
switchyard.finalize()
