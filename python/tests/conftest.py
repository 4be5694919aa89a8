"""Fixtures of the switchyard pytest suite: jobs of several Python processes started
by `switchyard launch` (or directly, with torchrun's variables), each bounded by a
timeout after which its whole process group is killed."""

import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKERS = pathlib.Path(__file__).resolve().parent / "workers"


def _switchyard_binary():
    """The `switchyard` command: $SWITCHYARD_BIN, else the workspace's build, else PATH."""
    named = os.environ.get("SWITCHYARD_BIN")
    if named:
        return named
    for profile in ("debug", "release"):
        built = ROOT / "target" / profile / "switchyard"
        if built.exists():
            return str(built)
    found = shutil.which("switchyard")
    if found:
        return found
    pytest.fail(
        "no switchyard command: build it (cargo build -p switchyard-cli) or set SWITCHYARD_BIN"
    )


class Job:
    """A finished job: its exit status and what it printed."""

    def __init__(self, returncode, out):
        self.returncode = returncode
        self.out = out

    def lines(self, prefix):
        """The lines that contain ``prefix``."""
        return [line for line in self.out.splitlines() if prefix in line]


def run_bounded(cmd, timeout, env=None):
    """Runs ``cmd`` in a process group of its own; kills the group at ``timeout``."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("%s still running after %d s; killed. Output:\n%s" % (cmd, timeout, out))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Job(proc.returncode, out)


@pytest.fixture
def launch():
    """``launch(n, worker, *args, restarts=0, timeout=120)``: runs
    ``switchyard launch -n n -- python workers/<worker>.py args`` and returns the
    :class:`Job`; fails the test when the launcher fails."""
    binary = _switchyard_binary()

    def run(n, worker, *args, restarts=0, timeout=120, env=None):
        cmd = [binary, "launch", "-n", str(n)]
        if restarts:
            cmd += ["--max-restarts", str(restarts)]
        cmd += ["--", sys.executable, str(WORKERS / (worker + ".py")), *args]
        job = run_bounded(cmd, timeout, env=env)
        assert job.returncode == 0, "launcher exit %d:\n%s" % (job.returncode, job.out)
        return job

    return run
