"""`python -m meshfuse.launch` and the examples, each run with its one command. These tests
start their own ranks, so they run outside mpirun only."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.single_process

EXAMPLES = {"tp_mlp.py": "tensor-parallel MLP", "sp_mlp.py": "sequence-parallel MLP",
            "tp_attention.py": "tensor-parallel attention", "dp_tp_mlp_2x2.py": "data x tensor parallel MLP"}


def clean_env():
    """The environment of a fresh shell: not inside any mpirun (no OMPI_*/PMI* variables)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "PMIX"))}


def run(argv, timeout=300, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=clean_env(), **kw)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_runs_with_one_command(example, repo_root):
    r = run([sys.executable, os.path.join(repo_root, "examples", "python", example)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hostir rank 0 {" in r.stdout and "hostir rank 1 {" in r.stdout
    assert f"{EXAMPLES[example]}: matches numpy on" in r.stdout and r.stdout.rstrip().endswith("OK")


def test_launch_runs_a_script_on_n_ranks(tmp_path):
    script = tmp_path / "hello.py"
    # One file per rank: mpirun may interleave the ranks' stdout mid-line.
    script.write_text("import sys, meshfuse\n"
                      f"open(f'{tmp_path}/out{{meshfuse.rank()}}', 'w').write("
                      "f'rank {meshfuse.rank()} of {meshfuse.world_size()} args {sys.argv[1:]}')\n")
    r = run([sys.executable, "-m", "meshfuse.launch", "-n", "3", str(script), "a", "--b"])
    assert r.returncode == 0, r.stderr
    assert [(tmp_path / f"out{i}").read_text() for i in range(3)] == [f"rank {i} of 3 args ['a', '--b']"
                                                                      for i in range(3)]


def test_launch_runs_a_module_and_sets_the_environment(tmp_path):
    (tmp_path / "probe.py").write_text(
        "import os\nrank = os.environ['OMPI_COMM_WORLD_RANK']\n"
        "open(f'out{rank}', 'w').write(' '.join([os.environ['OPENBLAS_NUM_THREADS'], os.environ['MASTER_ADDR'], "
        "str('MASTER_PORT' in os.environ)]))\n")
    r = run([sys.executable, "-m", "meshfuse.launch", "-n", "2", "-m", "probe"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [(tmp_path / f"out{i}").read_text() for i in range(2)] == ["1 127.0.0.1 True"] * 2


def test_dry_run_prints_the_mpirun_command():
    r = run([sys.executable, "-m", "meshfuse.launch", "-n", "64", "--dry-run", "train.py", "--lr", "1"])
    assert r.returncode == 0, r.stderr
    cmd = r.stdout.split()
    assert cmd[1:3] == ["-np", "64"] and "--oversubscribe" in cmd  # more ranks than cores
    assert cmd[-4:] == [sys.executable, "train.py", "--lr", "1"]
    assert cmd[cmd.index("-x") + 1] == "PYTHONPATH"


def test_launch_without_a_program_is_a_usage_error():
    r = run([sys.executable, "-m", "meshfuse.launch", "-n", "2"])
    assert r.returncode == 2 and "give a script to run" in r.stderr


def test_mpi4py_initializing_mpi_first_is_fine(tmp_path):
    """mpi4py initializes MPI, meshfuse uses that world, and the job ends cleanly (mpi4py, not
    meshfuse, finalizes MPI)."""
    script = tmp_path / "mpi4py_first.py"
    script.write_text(
        "from mpi4py import MPI\n"
        "import numpy as np, meshfuse\n"
        "from meshfuse import DeviceMesh, Shard, distribute_tensor\n"
        "assert (meshfuse.rank(), meshfuse.world_size()) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)\n"
        "x = np.arange(8, dtype=np.float32).reshape(4, 2)\n"
        "d = distribute_tensor(x, DeviceMesh(range(meshfuse.world_size())), [Shard(0)])\n"
        "assert np.array_equal(d.full_tensor(), x)\n"
        "MPI.COMM_WORLD.Barrier()\n"
        f"open(f'{tmp_path}/out{{meshfuse.rank()}}', 'w').write(meshfuse.communicator_name())\n")
    r = run([sys.executable, "-m", "meshfuse.launch", "-n", "2", str(script)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(tmp_path / f"out{i}").read_text() for i in range(2)] == ["mpi", "mpi"]

