"""A prepare_fun that raises aborts the allreduce on every rank:
its own rank raises the exception, the others a SwitchyardError naming that rank
and "prepare failed"; no rank gets a result computed without that rank's input."""

import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import WORKERS


def free_port():
    """A port the OS picked on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.parametrize("length", [4, 1 << 18])
def test_a_raising_prepare_fun_aborts_the_call_on_every_rank(length):
    port = free_port()
    procs = []
    try:
        for rank in range(3):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="3")
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS / "prepare_raises.py"), str(length)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=25)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert "the allreduce returned" not in "".join(outs), outs
    raised = re.search(r"rank 1: ValueError after ([0-9.]+) s: no input on rank 1", outs[1])
    assert raised, outs[1]
    for rank in (0, 2):
        told = re.search(r"rank %d: SwitchyardError after ([0-9.]+) s: (.*)" % rank, outs[rank])
        assert told, outs[rank]
        assert float(told.group(1)) < 5, outs[rank]
        assert "prepare failed on rank 1" in told.group(2), outs[rank]
        assert "no input on rank 1" in told.group(2), outs[rank]


def test_robust_mode_keeps_no_result_of_a_raising_prepare_fun(launch):
    job = launch(3, "prepare_raises_robust", restarts=1, timeout=120)
    assert "prepare_fun raised on rank 1" in job.out, job.out
    results = job.lines(": result ")
    assert len(results) == 3, job.out
    # 1 + 2 + 3: every rank's prepared input, rank 1's from its second life.
    for line in results:
        assert "result [6.0, 6.0, 6.0, 6.0] of 3" in line, job.out
