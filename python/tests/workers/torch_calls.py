"""Every call of the switchyard process group, checked against the result computed
here; prints "ok RANK" at the end. Ranks from torchrun's variables."""

import datetime
import warnings

import torch
import torch.distributed as dist

import switchyard.torch  # noqa: F401  (registers the backend)

dist.init_process_group("switchyard", timeout=datetime.timedelta(seconds=60))
rank, n = dist.get_rank(), dist.get_world_size()
R = dist.ReduceOp


def check(name, got, want):
    assert torch.equal(got, want), f"rank {rank}: {name}: got {got.tolist()}, want {want.tolist()}"


def each(f):
    """``[f(0), ..., f(n - 1)]``: what every rank contributes."""
    return [f(r) for r in range(n)]


def mine(r):
    return torch.tensor([r + 1, 2 * r + 3, 7], dtype=torch.float64)


# all_reduce: every operation on the types it takes, the result against a local one.
for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    ops += [R.AVG] if dtype.is_floating_point else [R.BOR, R.BAND, R.BXOR]
    for op in ops:
        inputs = each(lambda r: mine(r).to(dtype))
        t = inputs[rank].clone()
        dist.all_reduce(t, op=op)
        wide = [x.double() if dtype.is_floating_point else x.long() for x in inputs]
        if op == R.SUM:
            want = sum(wide)
        elif op == R.AVG:
            want = sum(wide) / n
        elif op == R.PRODUCT:
            want = torch.stack(wide).prod(0)
        elif op == R.MIN:
            want = torch.stack(wide).min(0).values
        elif op == R.MAX:
            want = torch.stack(wide).max(0).values
        else:
            want = wide[0].clone()
            for x in wide[1:]:
                want = {R.BOR: want | x, R.BAND: want & x, R.BXOR: want ^ x}[op]
        check(f"all_reduce {op} {dtype}", t, want.to(dtype))

# bool, complex, a non-contiguous tensor, several tensors at once.
t = torch.tensor([rank == 0, True, False])
dist.all_reduce(t, op=R.BAND)
check("all_reduce BAND bool", t, torch.tensor([n == 1, True, False]))
t = torch.tensor([rank == 0, True, False])
dist.all_reduce(t)
check("all_reduce SUM bool (a logical or)", t, torch.tensor([True, True, False]))
t = torch.tensor([complex(rank, 1)], dtype=torch.complex64)
dist.all_reduce(t)
check("all_reduce complex", t, torch.tensor([complex(sum(range(n)), n)], dtype=torch.complex64))
m = torch.arange(12.0).reshape(3, 4) + rank
col = m[:, 1]
dist.all_reduce(col)
check("all_reduce non-contiguous", m[:, 1], sum(torch.arange(12.0).reshape(3, 4)[:, 1] + r for r in range(n)))
check("all_reduce non-contiguous leaves the rest", m[:, 0], torch.arange(12.0).reshape(3, 4)[:, 0] + rank)
parts = [torch.full((2,), float(rank)), torch.full((3, 2), float(rank + 1))]
with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    dist.all_reduce_coalesced(parts)
check("all_reduce_coalesced first", parts[0], torch.full((2,), float(sum(range(n)))))
check("all_reduce_coalesced second", parts[1], torch.full((3, 2), float(sum(range(1, n + 1)))))

# Moving data: every dtype, as bytes.
for root in range(n):
    b = torch.full((5,), rank, dtype=torch.int16)
    dist.broadcast(b, root)
    check(f"broadcast from {root}", b, torch.full((5,), root, dtype=torch.int16))
out = [torch.empty(2, dtype=torch.int8) for _ in range(n)]
dist.all_gather(out, torch.full((2,), rank, dtype=torch.int8))
check("all_gather", torch.stack(out), torch.stack(each(lambda r: torch.full((2,), r, dtype=torch.int8))))
flat = torch.empty(2 * n)
dist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
check("all_gather_into_tensor", flat, torch.cat(each(lambda r: torch.full((2,), float(r)))))
# In place: each rank's part is its slice of the output (as FSDP passes it).
flat = torch.zeros(2 * n)
flat[2 * rank : 2 * rank + 2] = float(rank)
dist.all_gather_into_tensor(flat, flat[2 * rank : 2 * rank + 2])
check("all_gather_into_tensor in place", flat, torch.cat(each(lambda r: torch.full((2,), float(r)))))
o = torch.empty(2)
dist.reduce_scatter(o, [torch.full((2,), float(rank * 10 + j)) for j in range(n)])
check("reduce_scatter", o, torch.full((2,), float(sum(r * 10 + rank for r in range(n)))))
big = torch.arange(3.0 * n) + rank
keep = big.clone()
o = torch.empty(3)
dist.reduce_scatter_tensor(o, big)
check("reduce_scatter_tensor", o, sum(torch.arange(3.0 * n) + r for r in range(n))[3 * rank : 3 * rank + 3])
check("reduce_scatter_tensor leaves its input", big, keep)
o = torch.empty(3)
dist.reduce_scatter_tensor(o, torch.arange(3.0 * n) + rank, op=R.AVG)
check("reduce_scatter_tensor AVG", o, (sum(torch.arange(3.0 * n) + r for r in range(n)) / n)[3 * rank : 3 * rank + 3])
x = torch.full((2,), float(rank + 1))
dist.reduce(x, dst=n - 1, op=R.PRODUCT)
want = torch.full((2,), float(torch.arange(1, n + 1).prod())) if rank == n - 1 else torch.full((2,), float(rank + 1))
check("reduce", x, want)
g = [torch.empty(1) for _ in range(n)] if rank == 0 else None
dist.gather(torch.full((1,), float(rank)), g, dst=0)
if rank == 0:
    check("gather", torch.cat(g), torch.arange(float(n)))
s = torch.empty(2)
dist.scatter(s, [torch.full((2,), float(i * 7)) for i in range(n)] if rank == 0 else None, src=0)
check("scatter", s, torch.full((2,), float(rank * 7)))
# all_to_all_single with uneven splits: rank r sends r + j + 1 rows to rank j.
send = [r + j + 1 for r in range(n) for j in range(n)]
ins = torch.cat([torch.full((rank + j + 1, 2), float(100 * rank + j)) for j in range(n)])
outs = torch.empty(sum(r + rank + 1 for r in range(n)), 2)
dist.all_to_all_single(outs, ins, [r + rank + 1 for r in range(n)], [rank + j + 1 for j in range(n)])
check("all_to_all_single", outs, torch.cat([torch.full((r + rank + 1, 2), float(100 * r + rank)) for r in range(n)]))
outs = [torch.empty(1) for _ in range(n)]
dist.all_to_all(outs, [torch.full((1,), float(10 * rank + j)) for j in range(n)])
check("all_to_all", torch.cat(outs), torch.tensor([float(10 * r + rank) for r in range(n)]))
dist.barrier()

# A subgroup of the even ranks, its calls beside the world's.
evens = dist.new_group([r for r in range(n) if r % 2 == 0], backend="switchyard")
if rank % 2 == 0:
    t = torch.ones(1)
    dist.all_reduce(t, group=evens)
    check("new_group all_reduce", t, torch.full((1,), float((n + 1) // 2)))

# Asynchronous: the call progresses with nobody waiting for it. The last rank returns
# from its blocking call and says so through the store; only then does rank 0 wait.
store = dist.distributed_c10d._get_default_store()
t = torch.full((4,), float(rank))
if rank == 0 and n > 1:
    work = dist.all_reduce(t, async_op=True)
    future = work.get_future()
    # The other ranks' calls could only return with rank 0's part, which only its
    # communication thread could have sent: the wait times out without it.
    store.wait(["blocking rank done"], datetime.timedelta(seconds=30))
    work.wait()
    check("async get_future", future.value()[0], torch.full((4,), float(sum(range(n)))))
else:
    dist.all_reduce(t)
    if rank == n - 1 and n > 1:
        store.set("blocking rank done", "1")
check("async all_reduce", t, torch.full((4,), float(sum(range(n)))))

# Point to point. A ring of isend/irecv, every rank sending and receiving at once.
if n > 1:
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(1000)
    sent = dist.isend(torch.full((1000,), float(rank)), right)
    received = dist.irecv(got, left)
    sent.wait()
    received.wait()
    check("isend/irecv ring", got, torch.full((1000,), float(left)))
    # The same through batch_isend_irecv.
    got = torch.empty(4)
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), right), dist.P2POp(dist.irecv, got, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    check("batch_isend_irecv ring", got, torch.full((4,), float(left)))
    # Blocking, in order, large messages: even ranks send to the right, then receive
    # from the left; odd ranks the other way round (a blocking send of a large
    # tensor returns once its receiver has it, as MPI_Send may).
    for i in range(3):
        big = torch.full((1 << 18,), float(10 * rank + i))
        into = torch.empty(1 << 18)
        if rank % 2 == 0:
            dist.send(big, right)
            dist.recv(into, left)
        else:
            dist.recv(into, left)
            dist.send(big, right)
        check(f"send/recv message {i}", into, torch.full((1 << 18,), float(10 * left + i)))
    # Tags are separate channels: received in the other order than sent.
    if rank == 0:
        dist.send(torch.full((2,), 5.0), 1, tag=5)
        dist.send(torch.full((2,), 7.0), 1, tag=7)
    elif rank == 1:
        seven, five = torch.empty(2), torch.empty(2)
        dist.recv(seven, 0, tag=7)
        dist.recv(five, 0, tag=5)
        check("tags", torch.cat([five, seven]), torch.tensor([5.0, 5.0, 7.0, 7.0]))
    try:
        dist.recv(torch.empty(1))
    except NotImplementedError as e:
        assert "any source" in str(e), e
    else:
        raise AssertionError("recv from any source did not raise NotImplementedError")

# What is not offered says so.
try:
    dist.all_reduce(torch.ones(2, dtype=torch.int16))
except TypeError as e:
    assert "torch.int16" in str(e), e
else:
    raise AssertionError("an int16 all_reduce did not raise TypeError")
try:
    dist.all_reduce(torch.ones(2), op=R.BOR)
except TypeError as e:
    assert "BOR" in str(e) or "integer" in str(e), e
else:
    raise AssertionError("BOR on floats did not raise TypeError")

dist.barrier()
print(f"ok {rank}", flush=True)
dist.destroy_process_group()
