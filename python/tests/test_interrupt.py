"""Ctrl-C during a collective: KeyboardInterrupt on that rank, an error naming it on
the others, well before the silence timeout (30 s in the worker)."""

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time

from conftest import WORKERS


def test_ctrl_c_raises_keyboard_interrupt_and_the_peers_name_the_rank():
    port = str(20000 + random.randrange(12000))
    procs = []
    try:
        for rank in range(3):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="3")
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS / "interrupt.py")],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        assert procs[0].stdout.readline().strip() == "rank 0: waiting"
        time.sleep(0.5)
        procs[0].send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=20)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    first = re.search(r"rank 0: KeyboardInterrupt after ([0-9.]+) s", outs[0])
    assert first, outs[0]
    assert float(first.group(1)) < 2.5, outs[0]
    second = re.search(r"rank 1: SwitchyardError after ([0-9.]+) s: (.*)", outs[1])
    assert second, outs[1]
    assert float(second.group(1)) < 2.5, outs[1]
    assert "interrupted on rank 0" in second.group(2), outs[1]


def test_ctrl_c_while_data_moves_ends_the_call_and_the_peers_are_told():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    try:
        for rank in range(3):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="3")
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS / "interrupt_busy.py")],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        assert procs[0].stdout.readline().strip() == "rank 0: moving"
        time.sleep(0.5)
        signalled = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        outs = [p.communicate(timeout=20)[0] for p in procs]
        # Every rank had ended its calls before rank 0's 4 s pause was over.
        assert time.monotonic() - signalled < 15, outs
    finally:
        for p in procs:
            p.kill()
            p.wait()
    first = re.search(r"rank 0: KeyboardInterrupt (inside|outside) a call at ", outs[0])
    assert first, outs[0]
    # Almost always inside a call (the loop spends microseconds between calls); there
    # the call must end and tell the peers. Between calls the peers see rank 0 leave.
    expected = "interrupted on rank 0" if first.group(1) == "inside" else "rank 0"
    for rank in (1, 2):
        told = re.search(r"rank %d: SwitchyardError at ([0-9.]+) s: (.*)" % rank, outs[rank])
        assert told, outs[rank]
        assert expected in told.group(2), outs[rank]
