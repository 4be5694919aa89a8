"""Under `mpirun`. Built without the `mpi` feature, the package takes its ranks from
OpenMPI's variables and runs its collectives on the mesh over TCP; built with it
(`.ci/run` installs that build too and sets SWITCHYARD_EXPECT_ENGINE=mpi), on MPI's
own collectives. Skipped without an `mpirun`, unless SWITCHYARD_REQUIRE_MPIRUN=1 (CI)
makes that a failure."""

import os
import random
import shutil
import sys

import pytest

from conftest import WORKERS, run_bounded

# As switchyard-mpirun (mpirun/src/lib.rs) sets them: root in containers, more ranks
# than cores, loopback only.
OPENMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


def _mpirun():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        if os.environ.get("SWITCHYARD_REQUIRE_MPIRUN") == "1":
            pytest.fail("SWITCHYARD_REQUIRE_MPIRUN=1 and there is no mpirun")
        pytest.skip("no mpirun")
    return mpirun


def _run(worker):
    # A root port below Linux's ephemeral range, so no socket of another test holds it.
    env = dict(os.environ, MASTER_PORT=str(20000 + random.randrange(12000)), **OPENMPI_ENV)
    job = run_bounded([_mpirun(), "-np", "3", sys.executable, str(WORKERS / (worker + ".py"))], 120, env=env)
    assert job.returncode == 0, job.out
    return job


def test_rabit_basic_under_mpirun():
    job = _run("basic")
    engine = os.environ.get("SWITCHYARD_EXPECT_ENGINE", "mesh")
    for rank in range(3):
        assert "@node[%d] after-allreduce-sum: a=[6.0, 9.0, 12.0]" % rank in job.out, job.out
        assert "@node[%d] engine %s" % (rank, engine) in job.out, job.out


def test_every_dtype_under_mpirun():
    job = _run("dtypes")
    assert job.out.count("dtypes ok") == 3, job.out
