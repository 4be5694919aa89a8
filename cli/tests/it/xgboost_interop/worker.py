"""One XGBoost training worker for the tracker interop tests.

Joins the tracker named by DMLC_TRACKER_URI / DMLC_TRACKER_PORT (task id from
DMLC_TASK_ID), trains a small deterministic model on its rank's slice of a fixed data
set, checks a few collectives whose answers every rank can compute, and writes one JSON
line: {"rank", "task_id", "world", "model_sha256", "collectives_ok", "xgboost"}.

XGBoost 1.x reads the DMLC_* variables from the environment itself, so this script
passes nothing (it is then an unmodified 1.7 worker, as `switchyard launch` runs it).
XGBoost 2.1+ ignores the environment, so the same values are passed to
CommunicatorContext as arguments.

The line goes to stdout and, with --out-dir DIR, to DIR/rank-<rank>.json. Exit status:
0 when the collectives gave the expected answers, 3 when they did not, 4 when
--hold-until waited too long.

--hold-until PATH (with --out-dir): after training, write DIR/trained-<rank> and wait
for PATH to exist before the last tracker calls (print, shutdown), so that a test can
restart the tracker between bootstrap and the end of the job.

--signal-error-rank R (3.x, with --hold-until): after training, rank R reports an
error to the tracker (`collective.signal_error`) and the other ranks hold before any
collective, so that the tracker's error notice is the only thing that ends them before
the hold does (exit status 6 if the file appears).
"""

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import xgboost as xgb
from xgboost import collective

ROWS = 3000
COLS = 6
ROUNDS = 8
BIG = 40000


def context_args():
    """The CommunicatorContext arguments for this XGBoost version."""
    if int(xgb.__version__.split(".")[0]) < 2:
        return {}
    args = {}
    for key in ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT", "DMLC_TASK_ID"):
        if key in os.environ:
            args[key.lower()] = os.environ[key]
    if "dmlc_tracker_port" in args:
        args["dmlc_tracker_port"] = int(args["dmlc_tracker_port"])
    return args


def train(rank, world):
    """Trains on this rank's rows; returns the sha256 of the model's JSON."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, COLS))
    y = (x[:, 0] - 0.7 * x[:, 2] + 0.3 * x[:, 4] > 0).astype(np.float32)
    part = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    params = {
        "objective": "binary:logistic",
        "tree_method": "hist",
        "max_depth": 3,
        "nthread": 1,
        "seed": 0,
    }
    booster = xgb.train(params, xgb.DMatrix(x[part], label=y[part]), ROUNDS)
    return hashlib.sha256(bytes(booster.save_raw("json"))).hexdigest()


def collectives_ok(rank, world):
    """SUM of ones (long enough for the ring path) and MAX of the ranks."""
    total = collective.allreduce(np.ones(BIG), collective.Op.SUM)
    top = collective.allreduce(np.array([rank], dtype=np.int32), collective.Op.MAX)
    return bool(np.all(total == world)) and int(top[0]) == world - 1


def hold(out_dir, rank, path, limit_s):
    """Says this rank has trained, then waits (bounded) for the go-ahead file."""
    with open(os.path.join(out_dir, f"trained-{rank}"), "w", encoding="utf-8"):
        pass
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            print(f"worker: {path} did not appear in {limit_s} s", file=sys.stderr)
            sys.exit(4)
        time.sleep(0.02)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", help="also write the result to DIR/rank-<rank>.json")
    parser.add_argument("--hold-until", help="wait for this file before the last calls")
    parser.add_argument("--hold-limit", type=float, default=120.0, help="seconds")
    parser.add_argument("--signal-error-rank", type=int, help="this rank signals an error")
    opts = parser.parse_args()
    if opts.hold_until and not opts.out_dir:
        parser.error("--hold-until needs --out-dir")
    if opts.signal_error_rank is not None and not opts.hold_until:
        parser.error("--signal-error-rank needs --hold-until")

    with collective.CommunicatorContext(**context_args()):
        rank, world = collective.get_rank(), collective.get_world_size()
        digest = train(rank, world)
        if opts.signal_error_rank is not None:
            if rank == opts.signal_error_rank:
                collective.signal_error()
                print("worker: signal_error returned", file=sys.stderr)
                return 5
            hold(opts.out_dir, rank, opts.hold_until, opts.hold_limit)
            return 6
        ok = collectives_ok(rank, world)
        if opts.hold_until:
            hold(opts.out_dir, rank, opts.hold_until, opts.hold_limit)
        collective.communicator_print(f"worker rank {rank}/{world} done\n")
    line = json.dumps(
        {
            "rank": rank,
            "task_id": os.environ.get("DMLC_TASK_ID", ""),
            "world": world,
            "model_sha256": digest,
            "collectives_ok": ok,
            "xgboost": xgb.__version__,
        },
        sort_keys=True,
    )
    if opts.out_dir:
        path = os.path.join(opts.out_dir, f"rank-{rank}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as out:
            out.write(line + "\n")
        os.replace(path + ".tmp", path)
    print(line, flush=True)
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
