"""XGBoost's own tracker, as the reference the interop tests compare against.

Starts `xgboost.tracker.RabitTracker` (the classic rabit tracker in 1.x, the JSON
protocol tracker in 2.1+), prints where it listens in the form `switchyard tracker`
uses:

    DMLC_TRACKER_URI=<host>
    DMLC_TRACKER_PORT=<port>

(flushed at once), then waits for the job. Exit status: 0 when the job ended, 1 when
the tracker failed (3.x: also when --timeout seconds passed first), 2 when
--timeout seconds passed first (1.x).
"""

import argparse
import os
import sys
import threading

import xgboost as xgb
from xgboost.tracker import RabitTracker


def serve_1x(opts):
    """1.x: the Python rabit tracker; `join()` returns after n shutdowns."""
    tracker = RabitTracker(
        host_ip=opts.host, n_workers=opts.n, port=0, sortby=opts.sort_by
    )
    envs = tracker.worker_envs()
    announce(envs["DMLC_TRACKER_URI"], envs["DMLC_TRACKER_PORT"])
    failed = []

    def run():
        # 1.x's own start() would let an assert end the thread as quietly as success.
        try:
            tracker.accept_workers(opts.n)
        except Exception as err:  # noqa: BLE001 - any failure of the reference counts
            failed.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(opts.timeout)
    if thread.is_alive():
        print("ref_tracker: timed out waiting for the job", file=sys.stderr)
        return 2
    if failed:
        print(f"ref_tracker: the tracker failed: {failed[0]!r}", file=sys.stderr)
        return 1
    return 0


def serve_3x(opts):
    """2.1+: the C++ tracker behind a Python wrapper; `wait_for` raises on error."""
    tracker = RabitTracker(n_workers=opts.n, host_ip=opts.host, sortby=opts.sort_by)
    tracker.start()
    args = tracker.worker_args()
    announce(args["dmlc_tracker_uri"], args["dmlc_tracker_port"])
    try:
        tracker.wait_for(opts.timeout)
    except xgb.core.XGBoostError as err:
        print(f"ref_tracker: {err}", file=sys.stderr)
        # The serving thread may still run, and the tracker's destructor waits for it
        # without a limit: leave without running destructors.
        sys.stderr.flush()
        os._exit(1)
    return 0


def announce(host, port):
    """The two lines the test harness reads, flushed before any worker exists."""
    print(f"DMLC_TRACKER_URI={host}", flush=True)
    print(f"DMLC_TRACKER_PORT={port}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, required=True, help="number of workers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--sort-by", default="host", choices=("host", "task"))
    parser.add_argument("--timeout", type=int, default=300, help="seconds")
    opts = parser.parse_args()
    if int(xgb.__version__.split(".")[0]) < 2:
        return serve_1x(opts)
    return serve_3x(opts)


if __name__ == "__main__":
    sys.exit(main())
