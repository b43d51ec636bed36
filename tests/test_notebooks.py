"""Every notebook executes (small setting), so none can rot, and none leaves files behind."""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

NOTEBOOKS = ["1_quickstart.ipynb", "2_why_bi_encoders.ipynb", "3_pooling.ipynb", "4_training_dynamics.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name, tmp_path):
    # The notebooks' temporary files go to a directory of their own, which must be empty afterwards: a run left
    # in the system's temporary directory weighs about 1 GB, and one per test run filled a CI machine's disk.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, NOTEBOOK_SMALL="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), TMPDIR=str(tmp))
    env.pop("RUNS", None)
    env.pop("MODEL", None)
    result = subprocess.run([sys.executable, "notebooks/build.py", "--check", name], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (ROOT / "notebooks" / name).is_file(), "the committed notebook (with outputs) is missing"
    # torch's compile cache (torchinductor_<user>) is shared by every run and meant to stay.
    left = sorted(path.name for path in tmp.iterdir() if not path.name.startswith("torchinductor_"))
    assert left == [], "the notebook left these in its temporary directory"


def test_the_committed_notebooks_hold_their_builders_cells():
    # The committed notebooks carry outputs, so they are written by build.py and never edited by hand; a cell
    # changed in build.py but not in the committed notebook would show readers code that did not make the outputs.
    import importlib.util

    import nbformat
    spec = importlib.util.spec_from_file_location("notebooks_build", ROOT / "notebooks" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for name in NOTEBOOKS:
        committed = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        built = build.build(name)
        assert [cell.source for cell in committed.cells] == [cell.source for cell in built.cells], name
