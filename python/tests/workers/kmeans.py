"""k-means with checkpoints, after rabit's kmeans: each rank holds its own points,
every iteration sums the points of each cluster with one allreduce, and the
centroids are checkpointed. A rank killed in the middle (mock=...) is restarted,
loads the centroids from the survivors and catches up; the final centroids equal a
run without the kill.

    switchyard launch -n 4 --max-restarts 1 -- python kmeans.py mock=1,3,1,0
"""
import sys

import numpy as np

import switchyard

K, DIM, POINTS, ITERS = 4, 3, 500, 8

switchyard.init(sys.argv, robust=True)
rank, world = switchyard.get_rank(), switchyard.get_world_size()
assert switchyard.communicator().engine == "robust", switchyard.communicator()
points = np.random.default_rng(1000 + rank).normal(size=(POINTS, DIM))
points += np.repeat(np.arange(K), POINTS // K)[:, None] * 3.0

version, centroids = switchyard.load_checkpoint()
if version == 0:
    # The first K points of rank 0, agreed by a broadcast.
    centroids = switchyard.broadcast(points[:K].copy() if rank == 0 else None, 0)
else:
    print("rank %d: resumed at version %d" % (rank, version), flush=True)

prepared = 0
for it in range(version, ITERS):
    stats = np.zeros((K, DIM + 1))

    def prepare(stats):
        global prepared
        prepared += 1
        nearest = np.argmin(((points[:, None, :] - centroids[None]) ** 2).sum(-1), axis=1)
        for k in range(K):
            mine = points[nearest == k]
            stats[k, :DIM] = mine.sum(0)
            stats[k, DIM] = len(mine)

    switchyard.allreduce(stats, switchyard.SUM, prepare_fun=prepare)
    centroids = stats[:, :DIM] / np.maximum(stats[:, DIM:], 1)
    switchyard.checkpoint(centroids)

print("rank %d: prepared %d times from version %d" % (rank, prepared, version), flush=True)
if rank == 0:
    print("centroids %s" % np.round(centroids, 6).tolist(), flush=True)
switchyard.finalize()
