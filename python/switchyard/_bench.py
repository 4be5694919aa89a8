"""One rank of `switchyard bench allreduce --python`: the same timing loop as the
Rust worker (cli/src/bench/collective/worker.rs), from Python on numpy arrays.

    python -m switchyard._bench --out FILE --plan SIZE:ITERS:REPS,... [--mpi4py]

Each size: float32 arrays of ``SIZE`` bytes (a multiple of the world size in
elements), two warm-up calls, then ``REPS`` repetitions of ``ITERS`` calls after a
barrier; the per-call time of a repetition is the slowest rank's (a max allreduce),
and rank 0 writes ``size median_seconds`` lines to FILE. With ``--mpi4py`` the calls
are mpi4py's ``Allreduce`` (in place) under ``mpirun``, the baseline.
"""

import argparse
import statistics
import sys
import time

import numpy as np


def _switchyard_engine():
    import switchyard

    comm = switchyard.Communicator.from_env(timeout=120)
    return comm.rank, comm.world_size, (lambda buf: comm.allreduce(buf, switchyard.SUM)), comm.barrier, (
        lambda buf: comm.allreduce(buf, switchyard.MAX)
    )


def _mpi4py_engine():
    try:
        from mpi4py import MPI
    except ImportError as e:
        # A missing optional baseline is a usage error, not a crash.
        sys.exit("switchyard._bench: --mpi4py needs mpi4py, which is not installed (%s): pip install mpi4py" % e)

    world = MPI.COMM_WORLD

    def call(buf):
        world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def slowest(buf):
        world.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)

    return world.Get_rank(), world.Get_size(), call, world.Barrier, slowest


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--mpi4py", action="store_true")
    args = parser.parse_args()
    rank, n, call, barrier, slowest = _mpi4py_engine() if args.mpi4py else _switchyard_engine()
    lines = []
    for item in args.plan.split(","):
        size, iters, reps = (int(x) for x in item.split(":"))
        elements = -(-max(size // 4, 1) // n) * n
        buf = np.ones(elements, dtype=np.float32)
        for _ in range(min(2, iters)):
            call(buf)
        times = []
        for _ in range(reps):
            barrier()
            started = time.perf_counter()
            for _ in range(iters):
                call(buf)
            per_call = np.array([(time.perf_counter() - started) / iters], dtype=np.float32)
            slowest(per_call)
            times.append(float(per_call[0]))
        lines.append("%d %r\n" % (size, statistics.median(times)))
    if rank == 0:
        with open(args.out, "w") as f:
            f.writelines(lines)


if __name__ == "__main__":
    main()
