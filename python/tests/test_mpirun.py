"""Under `mpirun`: the package (built without the `mpi` feature) takes its ranks from
OpenMPI's variables and runs its collectives over TCP. Skipped without an `mpirun`,
unless SWITCHYARD_REQUIRE_MPIRUN=1 (CI) makes that a failure."""

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


def test_rabit_basic_under_mpirun():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        if os.environ.get("SWITCHYARD_REQUIRE_MPIRUN") == "1":
            pytest.fail("SWITCHYARD_REQUIRE_MPIRUN=1 and there is no mpirun")
        pytest.skip("no mpirun")
    # A root port below Linux's ephemeral range, so no socket of another test holds it.
    env = dict(os.environ, MASTER_PORT=str(20000 + random.randrange(12000)), **OPENMPI_ENV)
    job = run_bounded([mpirun, "-np", "3", sys.executable, str(WORKERS / "basic.py")], 120, env=env)
    assert job.returncode == 0, job.out
    for rank in range(3):
        assert "@node[%d] after-allreduce-sum: a=[6.0, 9.0, 12.0]" % rank in job.out, job.out
