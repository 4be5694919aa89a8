"""Trains a small MLP with DDP (or FSDP) for a few steps on synthetic data; prints each
step's loss and, at the end, a digest of the parameters' bytes.

Usage: torch_ddp.py BACKEND STEPS [bf16] [fsdp] [kill=STEP]
(ranks from torchrun's variables, or from `switchyard launch` through switchyard.torch).
"""

import datetime
import hashlib
import os
import signal
import sys

import torch
import torch.distributed as dist

import switchyard.torch  # noqa: F401  (registers the backend)

backend, steps = sys.argv[1], int(sys.argv[2])
flags = sys.argv[3:]
kill_at = next((int(f.split("=")[1]) for f in flags if f.startswith("kill=")), None)

dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

if "fsdp" in flags:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model)
    wrapped = model
else:
    wrapped = torch.nn.parallel.DistributedDataParallel(model)
    if "bf16" in flags:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)

optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.05)
data = torch.Generator().manual_seed(1000 + rank)
for step in range(steps):
    x = torch.randn(64, 16, generator=data)
    y = (x[:, :8].sum(1, keepdim=True) - x[:, 8:].sum(1, keepdim=True)).tanh()
    loss = torch.nn.functional.mse_loss(wrapped(x), y)
    optimizer.zero_grad()
    if kill_at == step and rank == size - 1:
        # Dies in the middle of the step's backward pass, after the first bucket.
        model[0].weight.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
    try:
        loss.backward()
    except Exception as e:  # noqa: BLE001 - the test reads what the survivors got
        print(f"rank {rank} step {step} error {type(e).__name__}: {e}", flush=True)
        sys.exit(3)
    optimizer.step()
    # The mean loss over the ranks, as every rank sees it.
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    print(f"rank {rank} step {step} loss {mean.item() / size!r}", flush=True)

digest = hashlib.sha256()
for p in model.parameters():
    full = p.full_tensor() if hasattr(p, "full_tensor") else p
    digest.update(full.detach().contiguous().numpy().tobytes())
print(f"rank {rank} params {digest.hexdigest()}", flush=True)
dist.destroy_process_group()
