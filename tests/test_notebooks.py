"""Every notebook executes (small setting), so none can rot."""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

NOTEBOOKS = ["1_quickstart.ipynb", "2_why_bi_encoders.ipynb", "3_pooling.ipynb", "4_training_dynamics.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes(name):
    env = dict(os.environ, NOTEBOOK_SMALL="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env.pop("RUNS", None)
    env.pop("MODEL", None)
    result = subprocess.run([sys.executable, "notebooks/build.py", "--check", name], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (ROOT / "notebooks" / name).is_file(), "the committed notebook (with outputs) is missing"
