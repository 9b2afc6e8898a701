"""Every runnable shell block of README.md and docs/*.md runs and exits 0 (STYLE.md 16).

A block is runnable when its fence is tagged ``bash doctest``::

    ```bash doctest
    build/meshfuse print examples/tp_mlp.mf
    ```

(GitHub renders the tag's first word, so the page looks like any bash block.) Each block runs as
one ``bash -euo pipefail`` script, as a reader would paste it, from a scratch folder that mirrors
the repository with ``build`` pointing at the build under test, so files a block writes (traces,
outputs) never land in the source tree. MPI runs as root and on more ranks than cores, as on CI,
through the environment (OMPI_*), not by editing the commands.

Run by ctest (``doc_blocks``): ``pytest tests/docs --source-dir=SRC --build-dir=BUILD``.
"""
import os
import pathlib
import re
import subprocess

import pytest

FENCE = re.compile(r"^```bash doctest[^\n]*\n(.*?)^```", re.S | re.M)


def runnable_blocks(source_dir):
    pages = [source_dir / "README.md"] + sorted((source_dir / "docs").glob("*.md"))
    for page in pages:
        text = page.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(page, line, m.group(1), id=f"{page.relative_to(source_dir)}:{line}")


def pytest_generate_tests(metafunc):
    if "block" in metafunc.fixturenames:
        src = pathlib.Path(metafunc.config.getoption("source_dir")).resolve()
        metafunc.parametrize("page,line,block", list(runnable_blocks(src)))


@pytest.fixture(scope="session")
def mirror(tmp_path_factory, request):
    """A folder whose entries link to the repository's, with build -> the build under test."""
    src = pathlib.Path(request.config.getoption("source_dir")).resolve()
    build = pathlib.Path(request.config.getoption("build_dir")).resolve()
    root = tmp_path_factory.mktemp("docs")
    for entry in src.iterdir():
        if entry.name not in ("build", ".git"):
            (root / entry.name).symlink_to(entry)
    (root / "build").symlink_to(build)
    return root


def test_block_runs(page, line, block, mirror):
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMPI_MCA_rmaps_base_oversubscribe": "1",  # 4 ranks on a 2-core CI machine
        "OPENBLAS_NUM_THREADS": "1", "MESHFUSE_COMM_TIMEOUT": "120",
    })
    script = "set -euo pipefail\n" + block
    r = subprocess.run(["bash", "-c", script], cwd=mirror, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (f"{page.name}:{line}: the documented block exited {r.returncode}\n--- block\n{block}"
                               f"--- stdout (tail)\n{r.stdout[-3000:]}\n--- stderr (tail)\n{r.stderr[-3000:]}")


def test_there_are_runnable_blocks(request):
    """The marker is in use: a typo in the tag would silently make every block unchecked."""
    src = pathlib.Path(request.config.getoption("source_dir")).resolve()
    pages = {p.values[0].name for p in runnable_blocks(src)}
    assert "README.md" in pages, "README.md has no ```bash doctest block"
    assert len(pages) >= 3, f"only {sorted(pages)} have runnable blocks"
