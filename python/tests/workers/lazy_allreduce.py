"""rabit's lazy_allreduce.py: the prepare function runs only when the result is
not recovered. Run with mock=0,0,1,0 under a restarting launcher: rank 0 dies
before its second allreduce and, restarted, gets the first result from rank 1
without preparing it again."""
import numpy as np

import switchyard

switchyard.init()
n = 3
rank = switchyard.get_rank()
a = np.zeros(n, dtype=np.int32)


def prepare(a):
    print("@node[%d] run prepare function" % rank, flush=True)
    for i in range(n):
        a[i] = rank + i


switchyard.allreduce(a, switchyard.MAX, prepare_fun=prepare)
print("@node[%d] after-allreduce-max: a=%s" % (rank, a.tolist()), flush=True)
switchyard.allreduce(a, switchyard.SUM)
print("@node[%d] after-allreduce-sum: a=%s" % (rank, a.tolist()), flush=True)
switchyard.finalize()
