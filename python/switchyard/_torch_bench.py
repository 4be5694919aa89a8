"""One rank of `switchyard bench torch`: torch.distributed calls on CPU tensors
through the process group of ``--backend`` (``switchyard`` or ``gloo``), started by
``switchyard launch`` (importing :mod:`switchyard.torch` sets torchrun's variables).

    python -m switchyard._torch_bench --backend switchyard|gloo --out FILE \\
        --plan CALL:SIZE:ITERS:REPS,...

``CALL`` is ``all_reduce`` (float32 SUM), ``broadcast`` (from rank 0),
``all_gather_into_tensor`` (``SIZE`` = the gathered total), ``reduce_scatter_tensor``
(``SIZE`` = the whole input; float32 SUM) or ``ddp_step`` (one training step of a
DDP-wrapped MLP of about 8.4 M float32 parameters on batches of 32, SGD; ``SIZE`` is
ignored and the parameters' bytes are reported). Each item: float32 tensors of
``SIZE`` bytes (a multiple of the world size in elements), two warm-up calls, then
``REPS`` repetitions of ``ITERS`` calls after a barrier; the per-call time of a
repetition is the slowest rank's (a MAX all_reduce), and rank 0 writes
``CALL SIZE median_seconds`` lines to FILE.
"""

import argparse
import os
import statistics
import time

import torch

import switchyard.torch  # noqa: F401  (registers the backend, adopts the launcher's variables)
import torch.distributed as dist

#: The calls a plan may name.
CALLS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "ddp_step")

#: The DDP model's layer widths: 1024-2048-2048-1024, 8.4 M parameters.
WIDTHS = (1024, 2048, 2048, 1024)
BATCH = 32
WARM_UP = 2


def parse_plan(text):
    """``CALL:SIZE:ITERS:REPS,...`` as a list of ``(call, size, iters, reps)``."""
    plan = []
    for item in text.split(","):
        call, size, iters, reps = item.split(":")
        if call not in CALLS:
            raise SystemExit(f"switchyard._torch_bench: unknown call {call!r} in --plan; calls: {', '.join(CALLS)}")
        plan.append((call, int(size), max(int(iters), 1), max(int(reps), 1)))
    return plan


def collective(call, size, n):
    """A function making one ``call`` on float32 tensors of about ``size`` bytes."""
    elements = -(-max(size // 4, 1) // n) * n
    if call == "all_reduce":
        buf = torch.ones(elements)
        return lambda: dist.all_reduce(buf)
    if call == "broadcast":
        buf = torch.ones(elements)
        return lambda: dist.broadcast(buf, 0)
    if call == "all_gather_into_tensor":
        out, part = torch.empty(elements), torch.ones(elements // n)
        return lambda: dist.all_gather_into_tensor(out, part)
    full, out = torch.ones(elements), torch.empty(elements // n)
    return lambda: dist.reduce_scatter_tensor(out, full)


def ddp_step():
    """A function making one DDP training step, and the parameters' bytes."""
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(WIDTHS) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    inputs = torch.randn(BATCH, WIDTHS[0])
    targets = torch.randn(BATCH, WIDTHS[-1])
    loss_fn = torch.nn.MSELoss()

    def step():
        optimizer.zero_grad(set_to_none=False)
        loss_fn(model(inputs), targets).backward()
        optimizer.step()

    return step, sum(p.numel() * p.element_size() for p in model.parameters())


def measure(run, iters, reps):
    """The median over ``reps`` repetitions of the slowest rank's time per call."""
    for _ in range(WARM_UP):
        run()
    times = []
    slowest = torch.zeros(1, dtype=torch.float64)
    for _ in range(reps):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            run()
        slowest[0] = (time.perf_counter() - started) / iters
        dist.all_reduce(slowest, dist.ReduceOp.MAX)
        times.append(float(slowest[0]))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", required=True, choices=("switchyard", "gloo"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--plan", required=True)
    args = parser.parse_args()
    plan = parse_plan(args.plan)
    # The ranks share the host's cores: one compute thread each, for both backends.
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    n = dist.get_world_size()
    lines = []
    for call, size, iters, reps in plan:
        if call == "ddp_step":
            run, size = ddp_step()
        else:
            run = collective(call, size, n)
        lines.append(f"{call} {size} {measure(run, iters, reps)!r}\n")
    if dist.get_rank() == 0:
        # Written whole or not at all: the coordinator keeps the times of a job whose
        # teardown failed after this point.
        with open(args.out + ".part", "w") as f:
            f.writelines(lines)
        os.replace(args.out + ".part", args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
