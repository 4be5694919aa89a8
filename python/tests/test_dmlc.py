"""The DMLC_* environment that rabit/XGBoost-era launchers set: a standalone
`switchyard tracker`, two workers started by hand with DMLC_TRACKER_URI,
DMLC_TRACKER_PORT and DMLC_TASK_ID, and the tracker exits 0 once both finished."""

import os
import signal
import subprocess
import sys

from conftest import WORKERS, _switchyard_binary


def test_rabit_basic_against_a_standalone_tracker():
    tracker = subprocess.Popen(
        [_switchyard_binary(), "tracker", "-n", "2", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        env = dict(os.environ)
        for _ in range(2):
            name, _, value = tracker.stdout.readline().strip().partition("=")
            assert name in ("DMLC_TRACKER_URI", "DMLC_TRACKER_PORT"), name
            env[name] = value
        workers = []
        for task in range(2):
            worker_env = dict(env, DMLC_TASK_ID=str(task))
            workers.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS / "basic.py")],
                    env=worker_env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        outs = []
        for w in workers:
            try:
                outs.append(w.communicate(timeout=60)[0])
            finally:
                if w.poll() is None:
                    os.killpg(w.pid, signal.SIGKILL)
        for w, out in zip(workers, outs):
            assert w.returncode == 0, out
        joined = "".join(outs)
        for rank in range(2):
            assert "@node[%d] after-allreduce-sum: a=[2.0, 4.0, 6.0]" % rank in joined, joined
        assert tracker.wait(timeout=30) == 0
    finally:
        if tracker.poll() is None:
            os.killpg(tracker.pid, signal.SIGKILL)
            tracker.wait()
