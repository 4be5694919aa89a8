"""switchyard for Python: rabit's API on numpy arrays.

The module-level functions are rabit's (``init``, ``allreduce``, ``broadcast``,
``checkpoint``, ``load_checkpoint``, ...), on one communicator per process; the
:class:`Communicator` class is the same API for programs that want more than one.

>>> import numpy as np, switchyard
>>> switchyard.init([])           # no launcher: a world of one
>>> a = switchyard.allreduce(np.arange(3.0), switchyard.SUM)
>>> a.tolist()
[0.0, 1.0, 2.0]
>>> switchyard.broadcast({"lr": 0.1}, 0)
{'lr': 0.1}
>>> switchyard.finalize()

Arrays are reduced in place, without a copy, and the call returns the same array
(rabit returned a reduced copy; pass ``a.copy()`` to keep the input). The GIL is
released while a call communicates, and Ctrl-C during a call raises
``KeyboardInterrupt`` on that rank while the others get a :class:`SwitchyardError`
naming it.

Ranks come from the environment: ``switchyard launch -n N -- python train.py``, a
rabit/XGBoost tracker's ``DMLC_*`` variables, torchrun's ``MASTER_ADDR``/``RANK``/
``WORLD_SIZE``, ``mpirun`` or ``srun``; with none of them, a world of one.
"""

import operator
import os
import pickle
import struct
import sys

import numpy as np

from . import _native
from ._native import SwitchyardError, new_unique_id

#: The package's version (the Rust extension's, which the package's is).
__version__ = _native.__version__

__all__ = [
    "MAX",
    "MIN",
    "SUM",
    "BITOR",
    "PROD",
    "Communicator",
    "SwitchyardError",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "checkpoint",
    "communicator",
    "finalize",
    "get_processor_name",
    "get_rank",
    "get_world_size",
    "init",
    "is_distributed",
    "load_checkpoint",
    "new_unique_id",
    "reduce_scatter",
    "tracker_print",
    "version_number",
]

# rabit's operator numbers, so that rabit programs run unchanged.
MAX = 0
MIN = 1
SUM = 2
BITOR = 3
PROD = 4

_OPS = {MAX: "max", MIN: "min", SUM: "sum", BITOR: "bitor", PROD: "prod"}

#: Environment variable that turns on robust mode in :func:`init` (``1``).
ENV_ROBUST = "SWITCHYARD_ROBUST"


def _op_name(op):
    if isinstance(op, str) and op.lower() in _OPS.values():
        return op.lower()
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        raise ValueError(
            "unknown reduction %r: use switchyard.SUM, PROD, MAX, MIN or BITOR" % (op,)
        ) from None


def _root(root, world_size):
    """``root`` as a rank of a world of ``world_size``: an integer (``TypeError``
    otherwise) inside it (``ValueError`` otherwise, worded as the Rust check's)."""
    try:
        root = operator.index(root)
    except TypeError:
        raise TypeError("broadcast: root %r is not an integer" % (root,)) from None
    if not 0 <= root < world_size:
        raise ValueError("broadcast: root %d is outside a world of %d" % (root, world_size))
    return root


# Buffers smaller than this travel inside the pickle: each out-of-band buffer is a
# collective of its own, which costs more than copying a small one (a broadcast of
# many small arrays was 4x slower than one pickled message).
_IN_BAND_BELOW = 64 << 10


def _dumps(obj):
    """Pickles ``obj`` (protocol 5) with its large buffers out of band.

    Returns the head (little-endian u64s ``[k][len(pickle)][len_1]..[len_k]``, then
    the pickle) and the ``k`` out-of-band buffers as memoryviews.
    """
    buffers = []

    def out_of_band(buffer):
        # pickle's rule: a true answer keeps the buffer in band.
        if buffer.raw().nbytes < _IN_BAND_BELOW:
            return True
        buffers.append(buffer)
        return False

    main = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    raws = [b.raw() for b in buffers]
    head = struct.pack("<%dQ" % (len(raws) + 2), len(raws), len(main), *(r.nbytes for r in raws))
    return head + main, raws


def _split(data):
    """The out-of-band buffers' lengths named by a head from :func:`_dumps`, the
    pickle, and what follows it."""
    view = memoryview(data)
    if len(view) < 16:
        raise SwitchyardError("a pickled object is truncated: %d bytes" % len(view))
    k, main_len = struct.unpack_from("<2Q", view, 0)
    start = 16 + 8 * k
    if start + main_len > len(view):
        raise SwitchyardError(
            "a pickled object is truncated: its head names %d buffers and a %d-byte pickle, %d bytes arrived"
            % (k, main_len, len(view))
        )
    lens = struct.unpack_from("<%dQ" % k, view, 16)
    return lens, view[start : start + main_len], view[start + main_len :]


def _pack(obj):
    """``obj`` as one bytes object: the head, then the out-of-band buffers."""
    head, raws = _dumps(obj)
    return b"".join([head, *raws])


def _unpack(data):
    """The object :func:`_pack` packed; its arrays share ``data``'s memory."""
    lens, main, rest = _split(data)
    if sum(lens) != len(rest):
        raise SwitchyardError(
            "a pickled object is truncated: its buffers need %d bytes, %d are there" % (sum(lens), len(rest))
        )
    buffers, at = [], 0
    for n in lens:
        buffers.append(rest[at : at + n])
        at += n
    return pickle.loads(main, buffers=buffers)


def _plain(a):
    """``a`` as the numbers the collectives move: numpy's ``datetime64`` and
    ``timedelta64`` arrays export no buffer, but their ``int64`` view (the same
    memory) does; anything else is returned as it is."""
    if isinstance(a, np.ndarray) and a.dtype.kind in "mM":
        return a.view(np.int64)
    if _is_bfloat16(a):
        return a.view(np.uint16)
    return a


def _is_bfloat16(a):
    """Whether ``a`` is an array of a numpy extension type named ``bfloat16``
    (``ml_dtypes.bfloat16``, which JAX and TensorFlow use): 2 bytes an element,
    the top half of a float32."""
    return isinstance(a, np.ndarray) and a.dtype.name == "bfloat16" and a.dtype.itemsize == 2


def _reduced(a, dtype):
    """``a`` as the native call takes it, and the element type to name: ``None``
    (the array's own) or ``"bfloat16"``: named by the caller over a uint16 array of
    bfloat16 bits, or taken from an ``ml_dtypes.bfloat16`` array (viewed as its
    uint16 bits, the same memory)."""
    if dtype is not None and dtype != "bfloat16":
        raise ValueError(
            'dtype=%r is not supported: the only dtype to name is "bfloat16" '
            "(other types come from the array itself)" % (dtype,)
        )
    if _is_bfloat16(a):
        return a.view(np.uint16), "bfloat16"
    return _plain(a), dtype


class Communicator:
    """A group of ranks that run collectives together.

    Made by :meth:`from_env`, :meth:`from_unique_id` or :meth:`solo`. One thread
    calls at a time, as with MPI and rabit. Usable as a context manager, which
    finalizes it.
    """

    def __init__(self, native):
        self._c = native

    @classmethod
    def from_env(cls, robust=False, args=(), timeout=None):
        """Joins the job the environment describes (see the module's doc).

        ``robust`` joins the tracker in robust mode (checkpoints, recovery after a
        worker dies; needs ``switchyard launch`` or a classic rabit tracker);
        ``args`` may hold rabit's ``mock=rank,version,seq,ndeath``; ``timeout`` is
        the silence timeout in seconds (default 300, or
        ``SWITCHYARD_COLLECTIVE_TIMEOUT``).
        """
        return cls(_native.Comm.from_env(bool(robust), list(args), timeout))

    @classmethod
    def from_unique_id(cls, unique_id, rank, world_size, timeout=None):
        """Rank ``rank`` of ``world_size``, from an id that one rank made with
        :func:`new_unique_id` and passed to the others; no tracker."""
        return cls(_native.Comm.from_unique_id(str(unique_id), int(rank), int(world_size), timeout))

    @classmethod
    def solo(cls):
        """A world of one."""
        return cls(_native.Comm.solo())

    def __repr__(self):
        return repr(self._c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    @property
    def rank(self):
        """This process's rank."""
        return self._c.rank

    @property
    def world_size(self):
        """The number of ranks."""
        return self._c.world_size

    @property
    def engine(self):
        """The engine that runs the calls: ``"mesh"`` (TCP), ``"mpi"`` (MPI's own
        collectives, in a build with the ``mpi`` feature under ``mpirun``),
        ``"robust"`` or ``"solo"`` (a world of one)."""
        return self._c.engine

    @property
    def robust(self):
        """Whether checkpoints and recovery are on."""
        return self._c.robust

    def get_rank(self):
        """This process's rank."""
        return self._c.rank

    def get_world_size(self):
        """The number of ranks."""
        return self._c.world_size

    def get_processor_name(self):
        """The host this rank runs on."""
        return self._c.processor_name

    def is_distributed(self):
        """Whether other processes take part."""
        return self._c.is_distributed()

    def allreduce(self, data, op, prepare_fun=None, dtype=None):
        """Reduces ``data`` (a C-contiguous, writable numpy array of float16,
        float32, float64, int32, int64, uint32, uint64 or uint8) in place over all
        ranks and returns it. ``prepare_fun(data)``, when given, fills ``data``
        first, and is not called when robust mode recovers the result from a
        survivor. ``datetime64`` and ``timedelta64`` arrays reduce as their
        ``int64`` counts (``MAX`` and ``MIN`` of datetimes, ``SUM`` of durations).

        bfloat16, which numpy lacks: pass a uint16 array of bfloat16 bits with
        ``dtype="bfloat16"``, or an ``ml_dtypes.bfloat16`` array as it is. float16
        and bfloat16 are summed (or multiplied) in float32 and rounded once per
        element, bit-identical on every rank."""
        plain, dtype = _reduced(data, dtype)
        if prepare_fun is not None and plain is not data:
            user_prepare = prepare_fun

            def prepare_fun(_buffer):
                user_prepare(data)

        self._c.allreduce(plain, _op_name(op), prepare_fun, dtype)
        return data

    def broadcast(self, data, root):
        """Returns ``root``'s ``data`` (any picklable object; the others pass
        ``None``) on every rank. Pickle protocol 5: numpy arrays travel out of band,
        without a copy on the root and straight into fresh writable numpy memory
        elsewhere."""
        root = _root(root, self._c.world_size)
        if self._c.rank == root:
            head, raws = _dumps(data)
            self._c.broadcast_bytes(head, root)
            for raw in raws:
                self._c.broadcast_into(raw, root)
            return data
        head = self._c.broadcast_bytes(None, root)
        lens, main, _ = _split(head)
        # numpy's allocator, not bytearray's: no zero-fill, and huge pages where the
        # kernel allows (a 2 GiB bytearray took 7 s of page faults before the first
        # byte arrived on the project machine, numpy's memory none).
        buffers = [np.empty(n, dtype=np.uint8) for n in lens]
        for buf in buffers:
            self._c.broadcast_into(buf, root)
        return pickle.loads(main, buffers=buffers)

    def allgather(self, data):
        """Every rank's ``data`` (one shape on all), stacked in rank order: an
        array of shape ``(world_size,) + data.shape``."""
        data = np.asarray(data)
        out = np.empty((self._c.world_size,) + data.shape, dtype=data.dtype)
        self._c.allgather(_plain(data), _plain(out))
        return out

    def reduce_scatter(self, data, op, dtype=None):
        """Reduces ``data`` over all ranks and returns this rank's block of the
        result: a view of ``data`` (flattened), which holds it. The rest of ``data``
        is left unspecified. Blocks split ``data`` evenly, the first
        ``len % world_size`` ranks getting one element more. ``dtype`` as for
        :meth:`allreduce`."""
        plain, dtype = _reduced(data, dtype)
        start, end = self._c.reduce_scatter(plain, _op_name(op), dtype)
        return data.reshape(-1)[start:end]

    def barrier(self):
        """Returns once every rank has called it."""
        self._c.barrier()

    def tracker_print(self, msg):
        """Prints ``msg`` in the tracker's log (on stderr without a tracker)."""
        self._c.tracker_print(str(msg))

    def checkpoint(self, global_model, local_model=None):
        """Commits a checkpoint (robust mode): ``global_model``, alike on every
        rank, and this rank's ``local_model``, copied to its ring successors. Any
        picklable objects. The version number grows by one."""
        local = None if local_model is None else _pack(local_model)
        self._c.checkpoint(_pack(global_model), local)

    def load_checkpoint(self, with_local=False):
        """The last checkpoint, as rabit returns it: ``(version, global_model)``, or
        ``(version, global_model, local_model)`` with ``with_local``; version 0 and
        ``None`` models on a fresh start. A restarted worker gets them from the
        survivors. Call it first, before any collective, on every rank. Outside
        robust mode nothing is ever kept, and it returns the fresh start, as rabit's
        non-robust engine did."""
        if not self._c.robust:
            return (0, None, None) if with_local else (0, None)
        found = self._c.load_checkpoint()
        if found is None:
            return (0, None, None) if with_local else (0, None)
        version, global_bytes, local_bytes = found
        global_model = _unpack(global_bytes)
        if not with_local:
            return version, global_model
        local_model = None if local_bytes is None else _unpack(local_bytes)
        return version, global_model, local_model

    def version_number(self):
        """Checkpoints committed so far."""
        return self._c.version_number()

    def recoveries(self):
        """How many times this rank formed a new mesh after a failure."""
        return self._c.recoveries()

    def finalize(self):
        """Closes the communicator; later calls raise :class:`SwitchyardError`."""
        self._c.finalize()


_comm = None


def _the():
    if _comm is None:
        raise RuntimeError("switchyard.init() has not been called")
    return _comm


def init(args=None, lib="standard", robust=None, timeout=None):
    """Joins the job; call it once before anything else.

    ``args`` (default ``sys.argv``) may hold rabit's ``mock=rank,version,seq,ndeath``
    kill points, which turn on robust mode; ``lib`` is accepted for rabit's
    signature (``"mock"`` also turns robust mode on). ``robust`` turns robust mode
    on or off explicitly; by default it is on when ``SWITCHYARD_ROBUST=1``.
    Calling ``init`` twice without :func:`finalize` raises ``RuntimeError``.
    """
    global _comm
    if _comm is not None:
        raise RuntimeError("switchyard.init() was already called; call switchyard.finalize() first")
    if args is None:
        args = sys.argv
    args = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
    mock = [a for a in args if a.startswith("mock=")]
    if robust is None:
        # The same rule as the library's variables: empty is unset, anything else
        # that is not a switch is an error naming the variable and the value.
        value = os.environ.get(ENV_ROBUST, "").strip()
        if value not in ("", "0", "1", "true", "false"):
            raise ValueError(f"{ENV_ROBUST}={value!r}: expected 1, 0, true or false")
        robust = bool(mock) or lib == "mock" or value in ("1", "true")
    _comm = Communicator.from_env(robust=robust, args=mock, timeout=timeout)


def finalize():
    """Closes the module's communicator (robust mode: after a last agreement)."""
    global _comm
    comm, _comm = _comm, None
    if comm is not None:
        comm.finalize()


def communicator():
    """The module's :class:`Communicator` (after :func:`init`), for what the module
    functions do not offer (its ``engine``, ``recoveries()``)."""
    return _the()


def get_rank():
    """This process's rank."""
    return _the().rank


def get_world_size():
    """The number of ranks."""
    return _the().world_size


def is_distributed():
    """Whether other processes take part."""
    return _the().is_distributed()


def get_processor_name():
    """The host this rank runs on."""
    return _the().get_processor_name()


def tracker_print(msg):
    """Prints ``msg`` in the tracker's log (on stderr without a tracker)."""
    _the().tracker_print(msg)


def allreduce(data, op, prepare_fun=None, dtype=None):
    """See :meth:`Communicator.allreduce`."""
    return _the().allreduce(data, op, prepare_fun, dtype)


def broadcast(data, root):
    """See :meth:`Communicator.broadcast`."""
    return _the().broadcast(data, root)


def allgather(data):
    """See :meth:`Communicator.allgather`."""
    return _the().allgather(data)


def reduce_scatter(data, op, dtype=None):
    """See :meth:`Communicator.reduce_scatter`."""
    return _the().reduce_scatter(data, op, dtype)


def barrier():
    """See :meth:`Communicator.barrier`."""
    _the().barrier()


def checkpoint(global_model, local_model=None):
    """See :meth:`Communicator.checkpoint`."""
    _the().checkpoint(global_model, local_model)


def load_checkpoint(with_local=False):
    """See :meth:`Communicator.load_checkpoint`."""
    return _the().load_checkpoint(with_local)


def version_number():
    """See :meth:`Communicator.version_number`."""
    return _the().version_number()
