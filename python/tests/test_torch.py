"""switchyard as a torch.distributed backend (``switchyard.torch``): every call against
a result computed in the worker, DDP and FSDP against Gloo in the same test, a rank
killed mid-step, and the two ways a job starts (torchrun, ``switchyard launch``).

Skipped when torch is missing, unless ``SWITCHYARD_REQUIRE_TORCH=1`` (CI), which makes
a missing torch a failure.
"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys

import pytest

from conftest import WORKERS, _switchyard_binary, run_bounded

if os.environ.get("SWITCHYARD_REQUIRE_TORCH") == "1":
    import torch  # noqa: F401  (a missing torch fails the run)
else:
    pytest.importorskip("torch")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(n, worker, *args, timeout=180):
    """Starts ``n`` ranks of ``workers/<worker>.py`` with torchrun's variables (no
    agent), each in a process group of its own; returns ``(exit statuses, output)``
    once all have ended, killing every one at ``timeout``."""
    port = _free_port()
    procs = []
    try:
        for rank in range(n):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n))
            for name in ("SWITCHYARD_RANK", "SWITCHYARD_RENDEZVOUS", "DMLC_TRACKER_URI"):
                env.pop(name, None)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS / (worker + ".py")), *map(str, args)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            )
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail("%s rank still running after %d s; killed" % (worker, timeout))
            outs.append(out)
        return [p.returncode for p in procs], "\n".join(outs)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _losses(out, n):
    """``{step: loss}`` from the DDP worker's output, checking that every rank
    printed the same mean loss at each step."""
    by_step = {}
    for rank, step, loss in re.findall(r"rank (\d+) step (\d+) loss (\S+?)(?=rank|\s|$)", out):
        by_step.setdefault(int(step), set()).add(float(loss))
    for step, values in by_step.items():
        assert len(values) == 1, "step %d: the ranks disagree on the mean loss: %s" % (step, values)
    return {step: values.pop() for step, values in sorted(by_step.items())}


def _digests(out):
    return set(re.findall(r"params ([0-9a-f]{64})", out))


# What torch 2.15's Gloo ranks now and then print as they abort while the process
# group is destroyed, after the training (about one launch in fifteen).
_GLOO_TEARDOWN = "terminate called without an active exception"


def _train(n, backend, steps, *flags):
    codes, out = run_ranks(n, "torch_ddp", backend, steps, *flags)
    # A Gloo rank that aborted in its teardown has still printed every step and its
    # parameters, which the checks below require: the baseline's run is whole.
    torn_down = backend == "gloo" and _GLOO_TEARDOWN in out
    ended = [c == 0 or (torn_down and c == -signal.SIGABRT) for c in codes]
    assert all(ended), "ranks exited %s:\n%s" % (codes, out)
    losses = _losses(out, n)
    assert sorted(losses) == list(range(steps)), out
    digests = _digests(out)
    assert len(re.findall(r"params ", out)) == n and len(digests) == 1, "parameters differ across ranks:\n" + out
    return losses, digests.pop()


def _assert_close(ours, gloo, rel):
    for step in ours:
        assert abs(ours[step] - gloo[step]) <= rel * abs(gloo[step]), "step %d: switchyard %r, gloo %r" % (
            step,
            ours[step],
            gloo[step],
        )


@pytest.mark.parametrize("n", [1, 3])
def test_every_call_gives_the_result_computed_locally(n):
    codes, out = run_ranks(n, "torch_calls")
    assert codes == [0] * n, "ranks exited %s:\n%s" % (codes, out)
    assert sorted(re.findall(r"ok (\d+)", out)) == [str(r) for r in range(n)], out


@pytest.mark.parametrize("n", [2, 4])
def test_ddp_trains_as_with_gloo(n):
    ours, digest = _train(n, "switchyard", 20)
    gloo, _ = _train(n, "gloo", 20)
    _assert_close(ours, gloo, 1e-5)
    if n == 2:
        assert _train(n, "switchyard", 20) == (ours, digest), "two runs of ours differ"


def test_ddp_with_a_bf16_compression_hook_trains_as_with_gloo():
    # Two ranks: the bf16 sum of two values is rounded once by both backends, so
    # the runs agree bit for bit (with more ranks Gloo rounds after every addition,
    # switchyard once).
    ours, digest = _train(2, "switchyard", 20, "bf16")
    gloo, gloo_digest = _train(2, "gloo", 20, "bf16")
    _assert_close(ours, gloo, 1e-5)
    assert digest == gloo_digest


def test_fsdp_trains_as_with_gloo():
    ours, digest = _train(2, "switchyard", 6, "fsdp")
    gloo, gloo_digest = _train(2, "gloo", 6, "fsdp")
    _assert_close(ours, gloo, 1e-5)
    assert digest == gloo_digest


def test_a_rank_killed_mid_step_is_named_by_every_other_rank():
    n = 3
    codes, out = run_ranks(n, "torch_ddp", "switchyard", 6, "kill=3", timeout=120)
    assert codes[n - 1] == -signal.SIGKILL, out
    errors = re.findall(r"rank (\d+) step 3 error (.*)", out)
    assert sorted(int(r) for r, _ in errors) == list(range(n - 1)), out
    for _, message in errors:
        assert "rank %d" % (n - 1) in message, "the error does not name the dead rank: " + message
    assert codes[: n - 1] == [3] * (n - 1), out


def test_torchrun_and_switchyard_launch_start_the_same_job():
    port = _free_port()
    program = [str(WORKERS / "torch_ddp.py"), "switchyard", "3"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port)]
    launch = [_switchyard_binary(), "launch", "-n", "2", "--", sys.executable]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    digests = []
    for cmd in (torchrun + program, launch + program):
        job = run_bounded(cmd, 180, env=env)
        assert job.returncode == 0, job.out
        assert len(_losses(job.out, 2)) == 3, job.out
        digests.append(_digests(job.out))
    # Each job's ranks end with one model, the same under either starter.
    assert len(digests[0]) == 1 and digests[0] == digests[1], digests


def test_the_guides_ddp_example_runs_as_written(tmp_path):
    guide = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "python.md").read_text()
    marker = "<!-- the DDP example: python/tests/test_torch.py runs this block as written"
    block = re.search(re.escape(marker) + r".*?-->\n```python\n(.*?)```", guide, re.S)
    assert block, "docs/guide/python.md lost its DDP example"
    program = tmp_path / "ddp.py"
    program.write_text(block.group(1))
    cmd = [_switchyard_binary(), "launch", "-n", "2", "--", sys.executable, str(program)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    job = run_bounded(cmd, 180, env=env)
    assert job.returncode == 0, job.out
    assert sorted(re.findall(r"rank (\d): loss \d", job.out)) == ["0", "1"], job.out
