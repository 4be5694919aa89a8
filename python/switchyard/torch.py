"""switchyard as a ``torch.distributed`` backend: ``init_process_group("switchyard")``.

Importing this module registers the backend ``"switchyard"`` for CPU tensors::

    import torch.distributed as dist
    import switchyard.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("switchyard")  # instead of "gloo"

It starts under ``torchrun`` (the ranks meet through the store torch hands every
backend, as Gloo's do) and under ``switchyard launch`` (importing the module then
sets torchrun's variables from the launcher's, with rank 0 serving the store).
``dist.new_group`` subgroups get communicators of their own.

Every call returns a :class:`Work` at once and runs on the group's communication
thread, in the order the calls were made, so that DDP's gradient buckets are reduced
while the backward pass goes on. ``wait()`` raises the call's error, which names the
rank that failed; ``get_future()`` completes when the call is done. After a failed
call the group refuses every later call with the first error.

Contiguous tensors are reduced in place, without a copy; a non-contiguous one is
copied into a contiguous tensor and back. Reductions take float16, bfloat16, float32,
float64, int32, int64, uint8 and bool tensors (complex ones for SUM and AVG); halves
are summed in float32 and rounded once. Calls that only move data (broadcast, the
gathers, scatter, all-to-all, send and recv) take every dtype. ``send``/``recv`` run
on a channel per (sender, receiver, tag), a two-rank communicator of its own; sends
of up to :data:`EAGER_BYTES` are eager.
"""

import atexit
import collections
import datetime
import os
import socket
import threading
import weakref

import numpy as np
import torch
import torch.distributed as dist
from torch.futures import Future

from . import Communicator, SwitchyardError, new_unique_id

__all__ = ["BACKEND", "EAGER_BYTES", "ProcessGroupSwitchyard", "Work"]

#: The backend's name for ``init_process_group`` and ``new_group``.
BACKEND = "switchyard"

#: Sends of at most this many bytes are eager: copied, sent in the background, done
#: at once (larger ones return when the receiver has the data, as MPI's do).
EAGER_BYTES = 64 << 10

# The store key under which a group's rank 0 publishes the unique id the group's
# ranks form their communicator from (the store is the group's own prefix store).
_UNIQUE_ID_KEY = "switchyard/unique_id"

_RedOp = dist.ReduceOp


class Work(dist.Work):
    """A call in flight: ``wait()`` blocks until it is done (raising its error),
    ``get_future()`` is a ``torch.futures.Future`` completed with the call's output
    tensors."""

    def __init__(self, name, run, result, queue):
        super().__init__()
        self._name = name
        self._queue = queue
        self._run = run
        self._result = result
        self._done = False
        self._error = None
        # The torch future, made on the first `get_future()` (a call waited for
        # never needs one).
        self._outcome = None
        self._future = None

    def _complete(self, error):
        """Marks the call done with ``error`` (or none) and completes its future."""
        with self._queue.mutex:
            self._error = error
            self._done = True
            outcome = self._outcome
            self._queue.call_done.notify_all()
        if outcome is not None:
            outcome.set_result((error, self._result))

    def _execute(self):
        """Runs the call (on the communication thread or, when it is the next call
        and nothing runs, on the thread that waits for it) and completes it."""
        try:
            self._run()
        except BaseException as e:  # noqa: BLE001 - handed to the waiter as it is
            self._complete(e)
        else:
            self._complete(None)

    def wait(self, timeout=None):
        """Waits for the call to finish and raises its error. ``timeout`` (a
        ``timedelta`` or seconds; zero or none: no limit of its own, the group's
        timeout still ends every call) raises ``TimeoutError`` naming the call."""
        seconds = _seconds(timeout)
        self._queue.help(self)
        with self._queue.mutex:
            if not self._queue.call_done.wait_for(lambda: self._done, seconds):
                raise TimeoutError(f"switchyard: {self._name} did not finish within {seconds} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        """Whether the call has finished, well or not."""
        return self._done

    def is_success(self):
        """Whether the call has finished without an error."""
        return self._done and self._error is None

    def exception(self):
        """The call's error once it failed, else ``None``."""
        return self._error

    def result(self):
        """The output tensors, after waiting for the call."""
        self.wait()
        return self._result

    def get_future(self):
        """A ``torch.futures.Future`` completed with the output tensors (or the
        error) when the call finishes."""
        with self._queue.mutex:
            if self._future is not None:
                return self._future
            # The future torch reads (DDP's reducer in C++ among them) must carry a
            # failure as an error of its own: `Future.set_exception` only stores the
            # exception as the value, which C++ then takes for tensors. An
            # exception raised inside a `then` callback marks the child failed.
            self._outcome = Future()
            self._future = self._outcome.then(_value_or_raise)
            done = self._done
        if done:
            self._outcome.set_result((self._error, self._result))
        return self._future


def _value_or_raise(outcome):
    """A call's output tensors from its ``(error, tensors)`` outcome, or its error."""
    error, result = outcome.value()
    if error is not None:
        raise error
    return result


def _seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return None if timeout <= 0 else float(timeout)


class _Queue:
    """One group's calls, run one at a time in the order they were made: by the
    communication thread, or by a thread that waits for the next call while nothing
    runs (a blocking call then costs no hand-over between threads)."""

    def __init__(self, name):
        self._pending = collections.deque()
        #: Guards the queue and every call's completion.
        self.mutex = threading.Lock()
        #: Signalled when a call is queued or one stops running.
        self._ready = threading.Condition(self.mutex)
        #: Signalled when a call completes.
        self.call_done = threading.Condition(self.mutex)
        self._running = False
        self._closed = False
        self._final = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, work):
        with self.mutex:
            if self._closed:
                raise SwitchyardError(f"{work._name}: the process group was destroyed")
            self._pending.append(work)
            self._ready.notify()

    def _take(self):
        """The next call to run, marked running; the mutex is held."""
        self._running = True
        return self._pending.popleft()

    def _finish(self):
        with self.mutex:
            self._running = False
            self._ready.notify()

    def help(self, work):
        """Runs ``work`` on this thread when it is the next call and none runs."""
        with self.mutex:
            if self._running or not self._pending or self._pending[0] is not work:
                return
            self._take()
        try:
            work._execute()
        finally:
            self._finish()

    def _serve(self):
        while True:
            with self.mutex:
                while self._running or (not self._closed and not self._pending):
                    self._ready.wait()
                if not self._pending:
                    final, self._final = self._final, None
                    break
                work = self._take()
            try:
                work._execute()
            finally:
                self._finish()
        if final is not None:
            final()

    def close(self, abandon=False, final=None, timeout=None):
        """Stops taking calls; runs those already made (``abandon``: fails them
        instead, and returns without waiting for a call in flight), then ``final``
        on the communication thread, which then ends. Waits for that for at most
        ``timeout`` seconds; whether the thread ended."""
        with self.mutex:
            self._closed = True
            self._final = final
            dropped = list(self._pending) if abandon else []
            if abandon:
                self._pending.clear()
            self._ready.notify_all()
        for work in dropped:
            work._complete(SwitchyardError(f"{work._name}: the process group was aborted before the call ran"))
        if not abandon and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True


# --- tensors as the numbers the native calls move ------------------------------------

# torch dtypes whose numpy view the native reductions take as they are.
_NATIVE = {torch.float16, torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8}
for _name in ("uint32", "uint64"):
    if hasattr(torch, _name):
        _NATIVE.add(getattr(torch, _name))
_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def _flat(t):
    """A contiguous tensor as one dimension, without autograd (the calls write
    gradients and buffers in place, as Gloo does)."""
    if t.requires_grad:
        t = t.detach()
    return t if t.dim() == 1 else t.reshape(-1)


def _bytes(t):
    """A contiguous tensor's memory as a writable uint8 numpy array."""
    return _flat(t).view(torch.uint8).numpy()


def _numbers(t, call):
    """A contiguous tensor as the native reductions take it: its numpy view and the
    element type to name (``None``: the array's own)."""
    t = _flat(t)
    if t.dtype in _NATIVE:
        return t.numpy(), None
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    if t.dtype == torch.bool:
        return t.view(torch.uint8).numpy(), None
    if t.is_complex():
        return _numbers(torch.view_as_real(t), call)
    raise TypeError(
        f"switchyard: {call} of {t.dtype} tensors is not supported; reductions take "
        "float16, bfloat16, float32, float64, int32, int64, uint8, bool and complex tensors"
    )


class _Contiguous:
    """A tensor's contiguous version for a call: the tensor itself when it is
    contiguous, else a copy that :meth:`back` writes into the original."""

    def __init__(self, t):
        self.original = t
        self.tensor = t if t.is_contiguous() else t.contiguous()

    def back(self):
        if self.tensor is not self.original:
            self.original.copy_(self.tensor)


# torch's operations by the names the native calls take (or "avg", "band" and
# "bxor", done in this module).
_OP_NAMES = {
    _RedOp.SUM: "sum",
    _RedOp.PRODUCT: "prod",
    _RedOp.MIN: "min",
    _RedOp.MAX: "max",
    _RedOp.BOR: "bitor",
    _RedOp.BAND: "band",
    _RedOp.BXOR: "bxor",
    _RedOp.AVG: "avg",
}


# `_op_of`'s answers so far, by operation and dtype (a handful: every call asks).
_OP_CHOSEN = {}


def _op_of(reduce_op, dtype, call):
    """The native operation for ``reduce_op`` on ``dtype`` elements: a name the
    native call takes, or one of ``"avg"``, ``"band"``, ``"bxor"`` done here."""
    op = getattr(reduce_op, "op", reduce_op)
    try:
        return _OP_CHOSEN[op, dtype]
    except KeyError:
        name = _op_checked(op, dtype, call)
    _OP_CHOSEN[op, dtype] = name
    return name


def _op_checked(op, dtype, call):
    """:func:`_op_of` for an operation and dtype not seen yet: the name, or the
    error that says why the pair is refused."""
    name = _OP_NAMES.get(op)
    if name is None:
        raise NotImplementedError(f"switchyard: {call} with ReduceOp {op} is not supported")
    integer = not (dtype in _FLOATS or dtype.is_complex)
    if name in ("bitor", "band", "bxor") and not integer:
        raise TypeError(f"switchyard: {call} with ReduceOp {op} needs integer or bool tensors, not {dtype}")
    if name == "avg" and integer:
        raise TypeError(f"switchyard: {call} with ReduceOp.AVG needs floating-point tensors, not {dtype}")
    if dtype.is_complex and name not in ("sum", "avg"):
        raise TypeError(f"switchyard: {call} of complex tensors takes SUM and AVG only, not {op}")
    if dtype == torch.bool:
        # As Gloo does: SUM and MAX are a logical or, PRODUCT and MIN a logical and
        # (a sum of the bytes would leave values a bool cannot hold).
        name = {"sum": "bitor", "max": "bitor", "prod": "band", "min": "band"}.get(name, name)
    return name


class ProcessGroupSwitchyard(dist.ProcessGroup):
    """A ``torch.distributed`` process group whose calls run on a switchyard
    :class:`~switchyard.Communicator` (made by the backend's creator from the
    store torch passes; see the module's doc)."""

    def __init__(self, comm, rank, size, timeout=None, store=None):
        super().__init__(rank, size)
        self._comm = comm
        self._native = comm._c
        self._rank = rank
        self._size = size
        self._timeout = timeout
        self._store = store
        self._queue = _Queue(f"switchyard-pg-{rank}")
        self._scratch_bytes = torch.empty(0, dtype=torch.uint8)
        # Point-to-point channels by (source, destination, tag), made on first use.
        self._channels = {}
        self._channels_lock = threading.Lock()

    def getBackendName(self):
        return BACKEND

    # The name torch gives the group: kept here, because the C++ group looks for it
    # in a backend object that a Python group does not have (DeviceMesh, and so
    # FSDP, read it).
    def _set_group_name(self, name):
        self._group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self):
        """The name torch gave the group."""
        return getattr(self, "_group_name", "")

    #: No coalescing managers: `batch_isend_irecv` then runs its operations one by
    #: one, each on its channel.
    supports_coalescing = False

    def _get_backend(self, device=None):
        # The group is its own backend (torch asks it for `batch_isend_irecv`).
        return self

    def __repr__(self):
        return f"ProcessGroupSwitchyard(rank={self._rank}, size={self._size}, engine={self._comm.engine})"

    @property
    def communicator(self):
        """The :class:`~switchyard.Communicator` the group's calls run on."""
        return self._comm

    # --- running calls ---------------------------------------------------------

    def _submit(self, name, run, result):
        work = Work(name, run, result, self._queue)
        self._queue.submit(work)
        return work

    def shutdown(self):
        """Finishes the calls already made and closes the communicators."""
        self._queue.close()
        self._comm.finalize()
        for channel in self._channels.values():
            channel.close()

    def abort(self):
        """Fails the calls not yet run and stops taking new ones; the communicator
        closes once a call in flight has ended (it ends at the latest at the
        group's timeout)."""
        self._queue.close(abandon=True, final=self._comm.finalize)

    # --- reductions ------------------------------------------------------------

    def _reduce_in_place(self, t, op, call):
        """Reduces the contiguous tensor ``t`` over the group in place with ``op``,
        a name from :func:`_op_of`."""
        if op == "band":
            # a & b == ~(~a | ~b): exact for every integer and bool.
            raw = t.view(torch.uint8) if t.dtype == torch.bool else t
            raw.bitwise_not_()
            self._native.allreduce(_numbers(raw, call)[0], "bitor", None, None)
            raw.bitwise_not_()
            return
        if op == "bxor":
            gathered = self._gathered(t)
            raw = gathered.view(torch.uint8) if t.dtype == torch.bool else gathered
            out = raw[0].clone()
            for row in raw[1:]:
                out.bitwise_xor_(row)
            (t.view(torch.uint8) if t.dtype == torch.bool else t).copy_(out)
            return
        array, dtype = _numbers(t, call)
        self._native.allreduce(array, "sum" if op == "avg" else op, None, dtype)
        if op == "avg":
            t.div_(self._size)

    def allreduce(self, tensors, opts=None):
        reduce_op = opts.reduceOp if opts is not None else _RedOp.SUM
        parts = [_Contiguous(t) for t in _one_or_more(tensors, "all_reduce")]
        ops = [_op_of(reduce_op, p.tensor.dtype, "all_reduce") for p in parts]

        def run():
            for p, op in zip(parts, ops):
                self._reduce_in_place(p.tensor, op, "all_reduce")
                p.back()

        return self._submit("all_reduce", run, list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        reduce_op = opts.reduceOp if opts is not None else _RedOp.SUM
        tensors = list(tensors)
        ops = {t.dtype: _op_of(reduce_op, t.dtype, "all_reduce_coalesced") for t in tensors}

        def run():
            # One call per dtype: the tensors of a dtype flattened into one buffer.
            by_dtype = collections.defaultdict(list)
            for t in tensors:
                by_dtype[t.dtype].append(t)
            for group in by_dtype.values():
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                self._reduce_in_place(flat, ops[flat.dtype], "all_reduce_coalesced")
                at = 0
                for t in group:
                    n = t.numel()
                    t.detach().copy_(flat[at : at + n].view_as(t))
                    at += n

        return self._submit("all_reduce_coalesced", run, tensors)

    def reduce(self, tensors, opts=None):
        reduce_op = opts.reduceOp if opts is not None else _RedOp.SUM
        root = opts.rootRank if opts is not None else 0
        (t,) = _one_or_more(tensors, "reduce")
        op = _op_of(reduce_op, t.dtype, "reduce")

        def run():
            # Every rank reduces; the root keeps the result, the others their input.
            work = _Contiguous(t) if self._rank == root else _Copy(t)
            self._reduce_in_place(work.tensor, op, "reduce")
            work.back()

        return self._submit("reduce", run, list(tensors))

    def reduce_scatter(self, outputs, input_lists, opts=None):
        reduce_op = opts.reduceOp if opts is not None else _RedOp.SUM
        (out,) = _one_or_more(outputs, "reduce_scatter")
        (inputs,) = _one_or_more(input_lists, "reduce_scatter")
        self._check_blocks(inputs, out, "reduce_scatter")
        op = _op_of(reduce_op, out.dtype, "reduce_scatter")

        def run():
            flat = torch.cat([t.detach().reshape(-1) for t in inputs])
            self._scatter_reduced(flat, out, op, "reduce_scatter")

        return self._submit("reduce_scatter", run, list(outputs))

    def reduce_scatter_single(self, output, input, opts=None):
        reduce_op = opts.reduceOp if opts is not None else _RedOp.SUM
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"switchyard: reduce_scatter_tensor: the input has {input.numel()} elements, "
                f"the output {output.numel()} x {self._size} ranks"
            )
        op = _op_of(reduce_op, input.dtype, "reduce_scatter_tensor")

        def run():
            # The input is left as it was: the reduction runs on a copy, in memory
            # the group keeps (fresh memory would be faulted in on every call).
            flat = self._scratch(input)
            flat.copy_(input.detach().reshape(-1))
            self._scatter_reduced(flat, output, op, "reduce_scatter_tensor")

        return self._submit("reduce_scatter_tensor", run, [output])

    _reduce_scatter_base = reduce_scatter_single

    def _scratch(self, like):
        """A flat tensor of ``like``'s dtype and size in the group's scratch memory,
        grown as needed and kept (used by one call at a time: calls run in turn)."""
        nbytes = like.numel() * like.element_size()
        if self._scratch_bytes.numel() < nbytes:
            self._scratch_bytes = torch.empty(nbytes, dtype=torch.uint8)
        return self._scratch_bytes[:nbytes].view(like.dtype)

    def _scatter_reduced(self, flat, out, op, call):
        """Reduces ``flat`` (``size`` blocks of ``out``'s length) with ``op`` and
        writes this rank's block into ``out``."""
        n = out.numel()
        if op in ("band", "bxor"):
            self._reduce_in_place(flat, op, call)
            block = flat[self._rank * n : (self._rank + 1) * n]
        else:
            array, dtype = _numbers(flat, call)
            start, end = self._native.reduce_scatter(array, "sum" if op == "avg" else op, dtype)
            # Blocks split evenly (every rank's is n elements here); complex tensors
            # are counted in their real and imaginary halves.
            per = array.size // flat.numel()
            block = flat[start // per : end // per]
            if op == "avg":
                block.div_(self._size)
        out.detach().copy_(block.view_as(out))

    def _gathered(self, t):
        """Every rank's ``t`` (one shape on all), stacked in rank order."""
        gathered = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype)
        self._native.allgather(_bytes(t.contiguous()), _bytes(gathered))
        return gathered

    def _check_blocks(self, inputs, out, call):
        if len(inputs) != self._size:
            raise ValueError(f"switchyard: {call}: {len(inputs)} input tensors for {self._size} ranks")
        for t in inputs:
            if t.numel() != out.numel() or t.dtype != out.dtype:
                raise ValueError(f"switchyard: {call}: every input tensor must match the output's size and dtype")

    # --- moving data ---------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        parts = [_Contiguous(t) for t in _one_or_more(tensors, "broadcast")]

        def run():
            for p in parts:
                self._native.broadcast_into(_bytes(p.tensor), root)
                if self._rank != root:
                    p.back()

        return self._submit("broadcast", run, list(tensors))

    def allgather(self, output_lists, inputs, opts=None):
        (outs,) = _one_or_more(output_lists, "all_gather")
        (t,) = _one_or_more(inputs, "all_gather")
        if len(outs) != self._size:
            raise ValueError(f"switchyard: all_gather: {len(outs)} output tensors for {self._size} ranks")

        def run():
            gathered = self._gathered(t)
            for out, row in zip(outs, gathered):
                out.detach().copy_(row)

        return self._submit("all_gather", run, list(output_lists))

    def all_gather_single(self, output, input, opts=None):
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"switchyard: all_gather_into_tensor: the output has {output.numel()} elements, "
                f"the input {input.numel()} x {self._size} ranks"
            )
        part = _Contiguous(output)

        def run():
            self._native.allgather(_bytes(input.contiguous()), _bytes(part.tensor))
            part.back()

        return self._submit("all_gather_into_tensor", run, [output])

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        works = [self.allgather([outs], [t], opts) for outs, t in zip(output_lists, inputs)]
        return works[-1] if works else self.barrier()

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier()

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1] if works else self.barrier()

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def gather(self, output_lists, inputs, opts=None):
        root = opts.rootRank if opts is not None else 0
        (t,) = _one_or_more(inputs, "gather")
        outs = output_lists[0] if self._rank == root else []
        if self._rank == root and len(outs) != self._size:
            raise ValueError(f"switchyard: gather: {len(outs)} output tensors for {self._size} ranks")

        def run():
            # An allgather, of which the root keeps the rows.
            gathered = self._gathered(t)
            for out, row in zip(outs, gathered):
                out.detach().copy_(row)

        return self._submit("gather", run, list(output_lists))

    def scatter(self, outputs, input_lists, opts=None):
        root = opts.rootRank if opts is not None else 0
        (out,) = _one_or_more(outputs, "scatter")
        ins = input_lists[0] if self._rank == root else []
        if self._rank == root and len(ins) != self._size:
            raise ValueError(f"switchyard: scatter: {len(ins)} input tensors for {self._size} ranks")

        def run():
            # The root's tensors broadcast as one block, of which each rank keeps its own.
            block = torch.empty((self._size,) + tuple(out.shape), dtype=out.dtype)
            if self._rank == root:
                for row, t in zip(block, ins):
                    row.copy_(t)
            self._native.broadcast_into(_bytes(block), root)
            out.detach().copy_(block[self._rank])

        return self._submit("scatter", run, list(outputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        out_splits = _splits(output_split_sizes, output, self._size, "all_to_all_single")
        in_splits = _splits(input_split_sizes, input, self._size, "all_to_all_single")

        def run():
            self._exchange(output, input, out_splits, in_splits, "all_to_all_single")

        return self._submit("all_to_all_single", run, [output])

    all_to_all_single = alltoall_base

    def alltoall(self, outputs, inputs, opts=None):
        if len(outputs) != self._size or len(inputs) != self._size:
            raise ValueError(f"switchyard: all_to_all: needs {self._size} input and output tensors")
        if len({t.dtype for t in list(outputs) + list(inputs)}) != 1:
            raise TypeError("switchyard: all_to_all: every tensor must have one dtype")

        def run():
            # The tensors as one flat input and output, one element a row.
            flat_in = torch.cat([t.detach().reshape(-1) for t in inputs])
            flat_out = torch.empty(sum(t.numel() for t in outputs), dtype=flat_in.dtype)
            out_splits = [t.numel() for t in outputs]
            self._exchange(flat_out, flat_in, out_splits, [t.numel() for t in inputs], "all_to_all")
            at = 0
            for t in outputs:
                t.detach().copy_(flat_out[at : at + t.numel()].view_as(t))
                at += t.numel()

        return self._submit("all_to_all", run, list(outputs))

    def _exchange(self, output, input, out_splits, in_splits, call):
        """Sends rows ``in_splits[j]`` of ``input`` to rank ``j`` and receives
        ``out_splits[i]`` rows from rank ``i`` into ``output``: every rank's
        splits, then every rank's input padded to the longest (two allgathers),
        of which each rank keeps the pieces addressed to it."""
        size = self._size
        row = input.numel() // input.shape[0] if input.dim() and input.shape[0] else 1
        all_splits = np.empty((size, size), dtype=np.int64)
        self._native.allgather(np.asarray(in_splits, dtype=np.int64), all_splits)
        longest = int(all_splits.sum(axis=1).max())
        padded = torch.zeros(longest * row, dtype=input.dtype)
        flat = input.detach().reshape(-1)
        padded[: flat.numel()] = flat
        gathered = torch.empty((size, longest * row), dtype=input.dtype)
        self._native.allgather(_bytes(padded), _bytes(gathered))
        pieces = []
        for src in range(size):
            start = int(all_splits[src, : self._rank].sum()) * row
            n = int(all_splits[src, self._rank]) * row
            if n != out_splits[src] * row:
                raise SwitchyardError(
                    f"{call}: rank {src} sends {n // row} rows to rank {self._rank}, which expects {out_splits[src]}"
                )
            pieces.append(gathered[src, start : start + n])
        output.detach().copy_(torch.cat(pieces).view(output.shape))

    def barrier(self, opts=None):
        return self._submit("barrier", self._native.barrier, [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier().wait(timeout)

    # --- point to point ------------------------------------------------------

    def send(self, tensors, dst, tag=0):
        (t,) = _one_or_more(tensors, "send")
        channel = self._channel(self._rank, dst, tag)
        if t.numel() * t.element_size() <= EAGER_BYTES:
            # Eager, as MPI's small sends: a copy goes out in the background and
            # the send is done at once (a failure is raised by the channel's next
            # call, and the receiver's recv names it).
            copy = t.detach().clone(memory_format=torch.contiguous_format)

            def run():
                channel.communicator()._c.broadcast_into(_bytes(copy), 0)

            return channel.submit_eager("send", run, [t])
        part = _Contiguous(t)

        def run():
            channel.communicator()._c.broadcast_into(_bytes(part.tensor), 0)

        return channel.submit("send", run, [t])

    def recv(self, tensors, src, tag=0):
        (t,) = _one_or_more(tensors, "recv")
        part = _Contiguous(t)
        channel = self._channel(src, self._rank, tag)

        def run():
            channel.communicator()._c.broadcast_into(_bytes(part.tensor), 0)
            part.back()

        return channel.submit("recv", run, [t])

    def _channel(self, src, dst, tag):
        """The channel from ``src`` to ``dst`` for ``tag``, made on first use."""
        if self._store is None:
            raise NotImplementedError("switchyard: send/recv need a group made by init_process_group or new_group")
        key = (src, dst, tag)
        with self._channels_lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = _Channel(self, src, dst, tag)
        return channel

    # --- not offered -------------------------------------------------------

    def recv_anysource(self, tensors, tag=0):
        raise NotImplementedError(
            "switchyard: recv from any source is not supported: name the sender (dist.recv(tensor, src))"
        )

    def gather_single(self, *args, **kwargs):
        raise NotImplementedError("switchyard: gather into one tensor is not supported; use gather")

    def _start_coalescing(self, device):
        raise NotImplementedError("switchyard: coalescing managers are not supported")

    def _end_coalescing(self, device):
        raise NotImplementedError("switchyard: coalescing managers are not supported")


class _Channel:
    """Point to point from one rank of a group to another, for one tag: a
    communicator of the two (rank 0 the sender; formed on first use through the
    group's store) whose broadcasts carry the tensors, and a queue of its own, so
    that a rank's sends and receives on different channels never wait for each
    other (a rank may send to its neighbour while receiving from it), and the
    messages of one channel arrive in the order they were sent."""

    def __init__(self, group, src, dst, tag):
        self._group = group
        self._src, self._dst, self._tag = src, dst, tag
        self._comm = None
        self._failed = None
        self._queue = _Queue(f"switchyard-p2p-{src}-{dst}-{tag}")
        _open_channels.add(self)

    def communicator(self):
        """The channel's communicator, formed on the first call (on the channel's
        thread: the two ranks meet through the group's store)."""
        if self._comm is None:
            key = f"switchyard/p2p/{self._src}->{self._dst}#{self._tag}"
            me = 0 if self._group._rank == self._src else 1
            store = self._group._store
            if me == 0:
                unique_id = new_unique_id()
                store.set(key, unique_id)
            else:
                unique_id = store.get(key).decode()
            self._comm = Communicator.from_unique_id(unique_id, me, 2, timeout=_seconds(self._group._timeout))
        return self._comm

    def submit(self, name, run, result):
        """Queues a call on the channel; its `Work`."""
        if self._failed is not None:
            raise SwitchyardError(f"{name}: an earlier send on this channel failed: {self._failed}")
        work = Work(name, run, result, self._queue)
        self._queue.submit(work)
        return work

    def submit_eager(self, name, run, result):
        """Queues a call whose caller does not wait for it: a `Work` done at once;
        a failure is kept, for the channel's next call to raise."""

        def run_or_keep_failure():
            try:
                run()
            except Exception as e:  # noqa: BLE001 - raised by the next call
                self._failed = e
                raise

        self.submit(name, run_or_keep_failure, result)
        done = Work(name, None, result, self._queue)
        done._complete(None)
        return done

    def close(self, timeout=None):
        """Finishes the calls already made (for at most ``timeout`` seconds) and
        closes the communicator."""
        _open_channels.discard(self)
        if self._queue.close(timeout=timeout) and self._comm is not None:
            self._comm.finalize()


# Channels not closed yet: a program that ends without destroy_process_group() still
# gets its eager sends out (for up to `_EXIT_FLUSH` seconds), before Python stops the
# channels' threads.
_open_channels = weakref.WeakSet()
_EXIT_FLUSH = 10.0


@atexit.register
def _flush_channels():
    for channel in list(_open_channels):
        channel.close(timeout=_EXIT_FLUSH)


class _Copy:
    """A contiguous copy of a tensor whose result is thrown away (:meth:`back` does
    nothing): a non-root rank's input to ``reduce`` stays as it was."""

    def __init__(self, t):
        self.tensor = t.detach().contiguous().clone()

    def back(self):
        pass


def _one_or_more(tensors, call):
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"switchyard: {call}: no tensors")
    for t in tensors:
        if isinstance(t, torch.Tensor) and not t.is_cpu:
            raise ValueError(f"switchyard: {call}: tensors must be on the CPU, not {t.device}")
    return tensors


def _splits(splits, t, size, call):
    rows = t.shape[0] if t.dim() else 1
    if not splits:
        if rows % size:
            raise ValueError(f"switchyard: {call}: {rows} rows do not split evenly over {size} ranks")
        return [rows // size] * size
    splits = [int(s) for s in splits]
    if len(splits) != size or sum(splits) != rows:
        raise ValueError(f"switchyard: {call}: split sizes {splits} do not cover {rows} rows over {size} ranks")
    return splits


# --- the backend's creator and the environment ----------------------------------------


def _create(store, rank, size, timeout):
    """The backend's creator: the group's ranks meet through ``store`` (rank 0
    publishes a unique id) and form a communicator whose silence timeout is the
    group's ``timeout``."""
    seconds = _seconds(timeout)
    if size == 1:
        comm = Communicator.solo()
    else:
        if rank == 0:
            unique_id = new_unique_id()
            store.set(_UNIQUE_ID_KEY, unique_id)
        else:
            unique_id = store.get(_UNIQUE_ID_KEY).decode()
        comm = Communicator.from_unique_id(unique_id, rank, size, timeout=seconds)
    return ProcessGroupSwitchyard(comm, rank, size, timeout, store)


# The store rank 0 serves under `switchyard launch` (kept alive with the process).
_launch_store = None


def _adopt_launch_environment():
    """Under ``switchyard launch`` without torchrun's variables: sets ``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the
    launcher's, rank 0 serving the store (torch's ``env://`` rendezvous then
    connects to it as to torchrun's agent store)."""
    global _launch_store
    env = os.environ
    if "RANK" in env or "SWITCHYARD_RANK" not in env or "SWITCHYARD_RENDEZVOUS" not in env:
        return
    rank = int(env["SWITCHYARD_RANK"])
    size = int(env["SWITCHYARD_WORLD_SIZE"])
    with Communicator.from_env() as comm:
        if rank == 0:
            host = _outward_address(env["SWITCHYARD_RENDEZVOUS"])
            _launch_store = dist.TCPStore(host, 0, size, True, wait_for_workers=False)
            address = comm.broadcast((host, _launch_store.port), 0)
        else:
            address = comm.broadcast(None, 0)
    host, port = address
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(size),
            "MASTER_ADDR": host,
            "MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": str(True),
        }
    )


def _outward_address(rendezvous):
    """The address of this host on the route to the launcher's rendezvous
    (``127.0.0.1`` when the launcher is on this host)."""
    host, _, port = rendezvous.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host.strip("[]"), int(port)))
        return s.getsockname()[0]


dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
_adopt_launch_environment()
