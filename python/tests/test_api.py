"""The module in one process (a world of one): rabit's calls, and the errors of bad
arguments, which name what is wrong."""

import numpy as np
import pytest

import switchyard


@pytest.fixture
def solo():
    switchyard.init([])
    yield
    switchyard.finalize()


def test_a_world_of_one_runs_every_call(solo):
    assert switchyard.get_rank() == 0 and switchyard.get_world_size() == 1
    assert switchyard.communicator().engine == "solo"
    assert not switchyard.is_distributed()
    assert switchyard.get_processor_name()
    a = np.arange(4, dtype=np.float32)
    assert switchyard.allreduce(a, switchyard.SUM) is a
    assert a.tolist() == [0, 1, 2, 3]
    assert switchyard.broadcast({"k": [1, 2]}, 0) == {"k": [1, 2]}
    assert switchyard.allgather(np.arange(3)).tolist() == [[0, 1, 2]]
    assert switchyard.reduce_scatter(np.arange(3.0), switchyard.MAX).tolist() == [0.0, 1.0, 2.0]
    switchyard.barrier()
    called = []
    switchyard.allreduce(a, switchyard.MAX, prepare_fun=lambda buf: called.append(buf is a))
    assert called == [True]


def test_init_twice_is_an_error_not_an_exit(solo):
    with pytest.raises(RuntimeError, match="already called"):
        switchyard.init([])
    assert switchyard.get_world_size() == 1


def test_calls_before_init_are_errors():
    with pytest.raises(RuntimeError, match="init"):
        switchyard.get_rank()


@pytest.mark.parametrize(
    "array, message",
    [
        (np.arange(8.0)[::2], "not C-contiguous"),
        (np.arange(4.0).reshape(2, 2).T, "not C-contiguous"),
        (np.zeros(4, dtype=np.uint16), "not supported"),
        (np.zeros(4, dtype=np.complex64), "not supported"),
    ],
)
def test_bad_arrays_are_value_errors(solo, array, message):
    with pytest.raises(ValueError, match=message):
        switchyard.allreduce(array, switchyard.SUM)


def test_a_read_only_array_is_a_value_error(solo):
    a = np.arange(4.0)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        switchyard.allreduce(a, switchyard.SUM)


def test_an_operation_the_type_lacks_is_a_value_error(solo):
    with pytest.raises(ValueError, match="BitOr is not defined for F64"):
        switchyard.allreduce(np.zeros(2), switchyard.BITOR)
    with pytest.raises(ValueError, match="unknown reduction"):
        switchyard.allreduce(np.zeros(2), 99)


def test_float16_and_bfloat16_bits_reduce_in_place(solo):
    h = np.array([1.5, -2.0, 65504.0], dtype=np.float16)
    assert switchyard.allreduce(h, switchyard.SUM) is h
    assert h.dtype == np.float16 and h.tolist() == [1.5, -2.0, 65504.0]
    bits = np.array([0x3FC0, 0xC000], dtype=np.uint16)  # bfloat16 1.5 and -2.0
    assert switchyard.allreduce(bits, switchyard.MAX, dtype="bfloat16") is bits
    assert bits.tolist() == [0x3FC0, 0xC000]
    assert switchyard.reduce_scatter(bits, switchyard.SUM, dtype="bfloat16").tolist() == [
        0x3FC0,
        0xC000,
    ]
    assert switchyard.reduce_scatter(h, switchyard.MIN).dtype == np.float16


def test_a_bfloat16_dtype_over_anything_but_uint16_is_a_value_error(solo):
    with pytest.raises(ValueError, match="needs a uint16 array"):
        switchyard.allreduce(np.zeros(2, np.float32), switchyard.SUM, dtype="bfloat16")
    with pytest.raises(ValueError, match="needs a uint16 array"):
        switchyard.reduce_scatter(np.zeros(2, np.float16), switchyard.SUM, dtype="bfloat16")
    with pytest.raises(ValueError, match='the only dtype to name is "bfloat16"'):
        switchyard.allreduce(np.zeros(2, np.uint16), switchyard.SUM, dtype="float8")
    with pytest.raises(ValueError, match="BitOr is not defined for BF16"):
        switchyard.allreduce(np.zeros(2, np.uint16), switchyard.BITOR, dtype="bfloat16")
    with pytest.raises(ValueError, match="BitOr is not defined for F16"):
        switchyard.allreduce(np.zeros(2, np.float16), switchyard.BITOR)


def test_ml_dtypes_bfloat16_arrays_reduce_as_they_are(solo):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([1.5, -2.0, 3.0], dtype=ml_dtypes.bfloat16)
    assert switchyard.allreduce(a, switchyard.SUM) is a
    assert a.dtype == ml_dtypes.bfloat16 and a.astype(np.float32).tolist() == [1.5, -2.0, 3.0]
    block = switchyard.reduce_scatter(a, switchyard.MAX)
    assert block.dtype == ml_dtypes.bfloat16 and block.astype(np.float32).tolist() == [1.5, -2.0, 3.0]
    gathered = switchyard.allgather(a)
    assert gathered.dtype == ml_dtypes.bfloat16 and gathered.shape == (1, 3)


def test_a_non_buffer_is_a_value_error(solo):
    with pytest.raises(ValueError, match="has no buffer"):
        switchyard.allreduce([1.0, 2.0], switchyard.SUM)


def test_checkpoints_need_robust_mode(solo):
    with pytest.raises(switchyard.SwitchyardError, match="not in robust mode"):
        switchyard.checkpoint({"w": 1})


def test_pickled_objects_keep_their_arrays_out_of_band():
    model = {"w": np.arange(10.0), "step": 3, "name": "m"}
    packed = switchyard._pack(model)
    back = switchyard._unpack(bytearray(packed))
    assert back["step"] == 3 and back["name"] == "m"
    assert np.array_equal(back["w"], model["w"]) and back["w"].flags.writeable
    with pytest.raises(switchyard.SwitchyardError, match="truncated"):
        switchyard._unpack(bytearray(packed[:-8]))


def test_small_arrays_travel_inside_the_pickle_and_large_ones_beside_it():
    # Each out-of-band buffer costs a broadcast of its own.
    model = {"small": [np.zeros(10) for _ in range(50)], "big": np.arange(100_000.0)}
    _, raws = switchyard._dumps(model)
    assert [r.nbytes for r in raws] == [800_000]
    back = switchyard._unpack(bytearray(switchyard._pack(model)))
    assert len(back["small"]) == 50 and np.array_equal(back["big"], model["big"])


def test_a_prepare_fun_that_calls_a_collective_is_told_it_cannot(solo):
    a = np.zeros(2, dtype=np.float32)
    with pytest.raises(switchyard.SwitchyardError, match="prepare_fun cannot call collectives"):
        switchyard.allreduce(a, switchyard.SUM, prepare_fun=lambda _: switchyard.barrier())


def test_a_finalized_communicator_raises():
    comm = switchyard.Communicator.solo()
    with comm:
        comm.barrier()
    with pytest.raises(switchyard.SwitchyardError, match="finalized"):
        comm.barrier()


def test_the_module_docstring_example_runs():
    import doctest

    failed, tried = doctest.testmod(switchyard)
    assert tried > 0 and failed == 0


# Error messages and small behaviours of the Python API.


def test_setup_failures_are_switchyard_errors(monkeypatch):
    # torchrun's variables with a world size that is not a number: the job's setup
    # is wrong, not an argument of the call.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "three")
    with pytest.raises(switchyard.SwitchyardError, match="WORLD_SIZE") as raised:
        switchyard.Communicator.from_env(timeout=5)
    assert not isinstance(raised.value, ValueError)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_empty_arrays_pass_through_every_call(solo, dtype):
    empty = np.zeros(0, dtype=dtype)
    assert switchyard.allgather(empty).shape == (1, 0)
    assert switchyard.reduce_scatter(empty, switchyard.SUM).shape == (0,)
    called = []
    assert switchyard.allreduce(empty, switchyard.SUM, prepare_fun=called.append) is empty
    assert len(called) == 1
    assert switchyard.allreduce(empty, switchyard.MAX).shape == (0,)


def test_load_checkpoint_outside_robust_mode_is_a_fresh_start(solo):
    # rabit's non-robust engine returned version 0 and no model.
    assert switchyard.load_checkpoint() == (0, None)
    assert switchyard.load_checkpoint(with_local=True) == (0, None, None)
    assert switchyard.version_number() == 0


@pytest.mark.parametrize("root", [-1, 1, 2**70])
def test_a_root_outside_the_world_is_a_value_error_naming_it(solo, root):
    with pytest.raises(ValueError, match="root %d is outside a world of 1" % root):
        switchyard.broadcast({"k": 1}, root)


def test_a_root_that_is_not_an_integer_is_a_type_error(solo):
    with pytest.raises(TypeError, match="root"):
        switchyard.broadcast({"k": 1}, 0.5)


def test_the_package_has_a_version():
    import importlib.metadata

    assert switchyard.__version__ == importlib.metadata.version("switchyard")


def test_the_mpi4py_baseline_without_mpi4py_says_so_without_a_traceback(tmp_path):
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("mpi4py") is not None:
        pytest.skip("mpi4py is installed")
    proc = subprocess.run(
        [sys.executable, "-m", "switchyard._bench", "--out", str(tmp_path / "out"), "--plan", "8:1:1", "--mpi4py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "mpi4py" in proc.stderr and "pip install mpi4py" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_datetime_and_timedelta_arrays_pass_every_call(solo):
    days = np.array(["2020-01-01", "2021-06-30"], dtype="datetime64[D]")
    assert switchyard.allreduce(days, switchyard.MAX) is days
    assert switchyard.allgather(days).tolist() == [days.tolist()]
    assert switchyard.broadcast(days, 0).tolist() == days.tolist()
    waits = np.array([5, 7], dtype="timedelta64[s]")
    seen = []
    switchyard.allreduce(waits, switchyard.SUM, prepare_fun=lambda a: seen.append(a is waits))
    assert seen == [True], "prepare_fun gets the array it was given"
    assert waits.tolist() == np.array([5, 7], dtype="timedelta64[s]").tolist()
    assert switchyard.reduce_scatter(waits, switchyard.SUM).dtype == waits.dtype
