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
        (np.zeros(4, dtype=np.float16), "not supported"),
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
