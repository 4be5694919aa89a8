"""rabit's basic.py: allreduce max, then sum, of rank + i."""
import numpy as np

import switchyard

switchyard.init()
n = 3
rank = switchyard.get_rank()
print("@node[%d] engine %s" % (rank, switchyard.communicator().engine))
a = np.zeros(n)
for i in range(n):
    a[i] = rank + i
print("@node[%d] before-allreduce: a=%s" % (rank, a.tolist()))
a = switchyard.allreduce(a, switchyard.MAX)
print("@node[%d] after-allreduce-max: a=%s" % (rank, a.tolist()))
a = switchyard.allreduce(a, switchyard.SUM)
print("@node[%d] after-allreduce-sum: a=%s" % (rank, a.tolist()))
switchyard.finalize()
