"""pytest setup for meshfuse's Python tests, run on 1 process and under mpirun -np 2 / -np 4.

Every rank runs every test; tests that need a given world size skip elsewhere. After each test
all ranks meet at a barrier, so one test's collectives never meet another's; a rank stuck in
a collective (its peer failed) is aborted by meshfuse's watchdog (MESHFUSE_COMM_TIMEOUT), so a
failure never becomes a hang.
"""

import os

import numpy as np
import pytest

import meshfuse


def pytest_configure(config):
    config.addinivalue_line("markers", "world(n): run only when the world has n ranks")
    config.addinivalue_line("markers", "single_process: run only outside mpirun (the test launches ranks itself)")


def pytest_collection_modifyitems(config, items):
    n = meshfuse.world_size()
    under_mpi = meshfuse.communicator_name() == "mpi"
    for item in items:
        w = item.get_closest_marker("world")
        if w is not None and n not in w.args:
            item.add_marker(pytest.mark.skip(reason=f"needs a world of {w.args} ranks, this one has {n}"))
        if item.get_closest_marker("single_process") is not None and under_mpi:
            item.add_marker(pytest.mark.skip(reason="launches its own ranks; runs outside mpirun"))


@pytest.fixture(autouse=True)
def _ranks_in_step():
    yield
    meshfuse.barrier()


@pytest.fixture
def world_mesh():
    return meshfuse.DeviceMesh(list(range(meshfuse.world_size())))


@pytest.fixture
def rng():
    """The same random numbers on every rank: each rank can build the full inputs and the oracle."""
    return np.random.default_rng(1234)


@pytest.fixture(scope="session")
def repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
