"""pytest setup for meshfuse's Python tests, run on 1 process and under mpirun -np 2 / -np 4.

Every rank runs every test. A test that needs particular world sizes says so with a marker,
``world(2, 4)`` or ``world(at_least=2)``; launches of other sizes leave it out (deselected, and
listed at the end with the reason) rather than skip it inside a run ctest shows as passed, and
``--world-coverage=1,2,4`` (the ctest entry pytest_world_coverage) fails when some test runs in
none of ctest's launches. After each test all ranks meet at a barrier, so one test's collectives never meet another's; a rank stuck in
a collective (its peer failed) is aborted by meshfuse's watchdog (MESHFUSE_COMM_TIMEOUT), so a
failure never becomes a hang.
"""

import os

import numpy as np
import pytest

import meshfuse


def pytest_addoption(parser):
    parser.addoption("--world-coverage", default=None, metavar="N,N,...",
                     help="check that every test runs in one of the launches of these world sizes "
                          "(1 runs outside mpirun), and run nothing")


def pytest_configure(config):
    config.addinivalue_line("markers", "world(*sizes, at_least=None): run only in a world of one of these sizes "
                                       "(or of at least at_least ranks)")
    config.addinivalue_line("markers", "single_process: run only outside mpirun (the test launches ranks itself)")


def _needs(item):
    """(accepts(world_size, under_mpi), why) of a test, or None when it runs in every launch."""
    w = item.get_closest_marker("world")
    if item.get_closest_marker("single_process") is not None:
        return (lambda n, under_mpi: not under_mpi), "launches its own ranks: runs outside mpirun"
    if w is None:
        return None
    least = w.kwargs.get("at_least")
    if least is not None:
        return (lambda n, under_mpi: n >= least), f"needs at least {least} ranks"
    sizes = tuple(w.args)
    words = "one rank" if sizes == (1,) else f"{' or '.join(map(str, sizes))} ranks"
    return (lambda n, under_mpi: n in sizes), f"needs a world of {words}"


def pytest_collection_modifyitems(config, items):
    coverage = config.getoption("--world-coverage")
    if coverage is not None:
        launches = [int(n) for n in coverage.split(",") if n]
        lines, uncovered = [], []
        for item in items:
            needs = _needs(item)
            if needs is None:
                continue
            accepts, why = needs
            where = [n for n in launches if accepts(n, n > 1)]
            (lines if where else uncovered).append(
                f"{item.nodeid}: {why}; " + (f"runs at {where}" if where else "no launch gives it that"))
        config._world_report = ("world coverage", lines + [f"NOT RUN {u}" for u in uncovered] + [
            f"{len(items)} tests, {len(lines) + len(uncovered)} of them at particular world sizes; "
            f"{len(uncovered)} run in none of the launches {launches}"])
        if uncovered:
            raise pytest.UsageError("tests that no launch runs:\n  " + "\n  ".join(uncovered))
        config.hook.pytest_deselected(items=list(items))
        items[:] = []
        return
    n = meshfuse.world_size()
    under_mpi = meshfuse.communicator_name() == "mpi"
    kept, left_out = [], []
    for item in items:
        needs = _needs(item)
        if needs is None or needs[0](n, under_mpi):
            kept.append(item)
        else:
            left_out.append((item, needs[1]))
    if left_out:
        config.hook.pytest_deselected(items=[item for item, _ in left_out])
        items[:] = kept
        config._world_report = (f"not run in a world of {n} (they run in the launches that have what they need)",
                                [f"{item.nodeid}: {why}" for item, why in left_out])


def pytest_sessionfinish(session, exitstatus):
    # The coverage check deselects every test it checked: that is its success, not "no tests".
    if session.config.getoption("--world-coverage") is not None and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.exitstatus = pytest.ExitCode.OK


def pytest_terminal_summary(terminalreporter, config):
    report = getattr(config, "_world_report", None)
    if report is None or (meshfuse.is_initialized() and meshfuse.rank() != 0):
        return
    title, lines = report
    terminalreporter.section(title)
    for line in lines:
        terminalreporter.write_line(line)


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
