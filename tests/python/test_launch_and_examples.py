"""`python -m meshfuse.launch` and the examples, each run with its one command. These tests
start their own ranks, so they run outside mpirun only."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.single_process

EXAMPLES = {"tp_mlp.py": "tensor-parallel MLP", "sp_mlp.py": "sequence-parallel MLP",
            "tp_attention.py": "tensor-parallel attention", "dp_tp_mlp_2x2.py": "data x tensor parallel MLP",
            "ulysses_seed003.py": "seed 003 Ulysses example (f16)", "dit_cfg.py": "DiT block with CFG x Ulysses"}


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


def test_seed_003_ulysses_example_on_4_ranks(repo_root):
    """The seed's full size (sequence 4096, f16) with the sequence split 4 ways (2 heads per rank)."""
    r = run([sys.executable, os.path.join(repo_root, "examples", "python", "ulysses_seed003.py"), "--ranks", "4"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Shard(1) on 4 ranks equals one device bit for bit" in r.stdout
    assert "seed 003 Ulysses example (f16): matches numpy on 4 ranks" in r.stdout and r.stdout.rstrip().endswith("OK")


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



def test_an_uncaught_exception_on_one_rank_ends_every_rank(tmp_path):
    """Rank 1 raises between two calls. Without meshfuse's excepthook rank 1 would wait in
    MPI_Finalize and rank 0 in the second call's allreduce until MESHFUSE_COMM_TIMEOUT (set far
    beyond the subprocess timeout here, which only detects a hang)."""
    script = tmp_path / "rank_fails.py"
    script.write_text(
        "import numpy as np, meshfuse\n"
        "from meshfuse import DeviceMesh, FusionDefinitionWrapper, Replicate, Shard, distribute_tensor\n"
        "def define(fd):\n"
        "    x, w1, w2 = fd.define_tensor([-1, 8]), fd.define_tensor([16, 8]), fd.define_tensor([8, 16])\n"
        "    fd.add_output(fd.ops.linear(fd.ops.relu(fd.ops.linear(x, w1)), w2))\n"
        "mesh = DeviceMesh(range(meshfuse.world_size()))\n"
        "arrays = [np.ones(s, dtype=np.float32) for s in [(4, 8), (16, 8), (8, 16)]]\n"
        "inputs = [distribute_tensor(a, mesh, [p]) for a, p in zip(arrays, [Replicate(), Shard(0), Shard(1)])]\n"
        "fdw = FusionDefinitionWrapper(define)\n"
        "fdw(inputs)\n"
        "if meshfuse.rank() == 1:\n"
        "    raise RuntimeError('rank 1 fails mid-program')\n"
        "fdw(inputs)\n"
        f"open(f'{tmp_path}/done{{meshfuse.rank()}}', 'w').write('done')\n")
    env = dict(clean_env(), MESHFUSE_COMM_TIMEOUT="3600")
    r = subprocess.run([sys.executable, "-m", "meshfuse.launch", "-n", "2", str(script)], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "meshfuse: rank 1 of 2 raised an exception that nothing caught:" in r.stderr
    assert "RuntimeError: rank 1 fails mid-program" in r.stderr  # the traceback, then the abort
    assert "meshfuse: rank 1 of 2 fails: uncaught RuntimeError: rank 1 fails mid-program" in r.stderr
    assert not (tmp_path / "done0").exists()  # rank 0 was ended inside its second call


def test_an_uncaught_exception_in_a_world_of_one_is_left_to_python():
    r = run([sys.executable, "-c", "import meshfuse\nmeshfuse.init()\nraise KeyError('plain')"])
    assert r.returncode == 1 and r.stderr.rstrip().endswith("KeyError: 'plain'")
    assert "meshfuse: rank" not in r.stderr and "MPI_Abort" not in r.stderr
