"""The package a researcher installs: the wheel carries every package the scripts import and the
shipped configs, installs no top-level module another library owns, and its entry points run the
same command lines as ``python train.py`` / ``python evaluate.py`` from outside the clone."""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT

OWN_PACKAGES = {"datamodules", "encoders", "harness", "lightning_modules", "sentemb_configs"}


def running_site_packages() -> list[str]:
    """The site-packages folders of the interpreter running the tests: a venv's own, not its base interpreter's
    (``system_site_packages`` would expose the base's, which in a fresh venv holds no torch)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def nested_venv(env_dir: Path, wheel: Path) -> Path:
    """A venv with ``wheel`` installed that sees the running interpreter's packages (torch, lightning, ...) but not
    the clone. The wheel goes in first, while the venv sees nothing else: pip would otherwise find the clone's
    editable install (or its *.egg-info on PYTHONPATH) of the same version and install nothing. Then a plain path line in a ``.pth``
    file adds the running interpreter's folders after the venv's own; the ``.pth`` files inside them (that
    editable install among them) are not read, so the wheel installed here is what imports."""
    venv.EnvBuilder(system_site_packages=False, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    outside = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the clone (its *.egg-info) unseen too
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300, env=outside)
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (Path(own) / "running_interpreter.pth").write_text("".join(f"{p}\n" for p in running_site_packages()))
    return python


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tree (a build leaves build/ and *.egg-info behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "runs", "models", "build", "*.egg-info", "__pycache__", ".pytest_cache", "lightning_logs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist")], check=True, capture_output=True, text=True, timeout=300)
    (found,) = (tmp / "dist").glob("*.whl")
    return found


def test_wheel_holds_every_imported_package_and_no_foreign_top_level_module(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == OWN_PACKAGES
    assert "sentemb_configs/sbert_nli_softmax.yaml" in names and "sentemb_configs/dclr/official.yaml" in names
    assert "sentemb_configs/overlays/offline_wiki.yaml" in names
    # Every project package that the installed code imports is in the wheel.
    imported = set()
    for name in names:
        if name.endswith(".py"):
            tree = ast.parse(zipfile.ZipFile(wheel).read(name))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
                elif isinstance(node, ast.Import):
                    imported.update(a.name.split(".")[0] for a in node.names)
    project_dirs = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} | {"train", "evaluate", "mine"}
    assert imported & (project_dirs - {"configs"}) <= OWN_PACKAGES  # never train, evaluate, tests, ...
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "sentemb-train = harness.launch:train" in text and "sentemb-evaluate = harness.launch:evaluate" in text
    assert "sentemb-mine = harness.mine_cli:main" in text


@pytest.mark.slow
def test_installed_entry_points_run_outside_the_clone(wheel, tmp_path, tiny_model_dir):
    env_dir = tmp_path / "venv"
    python = nested_venv(env_dir, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(env_dir / "bin" / args[0]), *args[1:]], cwd=elsewhere, env=env,
                              capture_output=True, text=True, timeout=600)

    where = subprocess.run([str(python), "-c", "import harness, sentemb_configs; print(harness.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where, f"harness imported from {where}, not from the installed wheel"

    for script in ("sentemb-train", "sentemb-evaluate", "sentemb-stage", "sentemb-mine"):
        result = run(script, "--help")
        assert result.returncode == 0 and f"usage: {script}" in result.stdout, result.stderr[-2000:]
    shipped = run("sentemb-configs")
    assert shipped.returncode == 0 and "sbert_nli_softmax.yaml" in shipped.stdout, shipped.stderr
    printed = run("sentemb-train", "--config", "configs/sbert_nli_softmax.yaml", "--print_config")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert "class_path: lightning_modules.NLISoftmax" in printed.stdout
    evaluated = run("sentemb-evaluate", "--model", tiny_model_dir, "--sts_dir", str(FIXTURES / "sts"),
                    "--tasks", "stsb,sickr", "--output", str(tmp_path / "results.json"))
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert (tmp_path / "results.json").is_file() and "| STS-B | SICK-R | avg |" in evaluated.stdout
    typo = run("sentemb-train", "--config", "configs/quickstart.yaml", "--trainer.max_step", "10")
    assert typo.returncode == 2
    assert typo.stderr.splitlines()[0] == "error: unknown option --trainer.max_step; did you mean --trainer.max_steps?"
    # the quickstart, as a researcher runs it after `pip install`: its sample rows come with the package
    quick = run("sentemb-train", "--config", "configs/quickstart.yaml", "--trainer.max_steps", "2",
                "--trainer.precision", "32", "--model.init_args.encoder.init_args.model_name", tiny_model_dir,
                "--trainer.default_root_dir", str(tmp_path / "quickstart"))
    assert quick.returncode == 0, quick.stderr[-3000:]
    assert list((tmp_path / "quickstart").glob("lightning_logs/*/checkpoints/*.ckpt"))
    assert "sentemb_configs/quickstart/stsb.train.tsv" in zipfile.ZipFile(wheel).namelist()


def test_ci_runs_the_readme_test_command_in_a_venv_of_its_own(tmp_path):
    """``.ci/run`` makes ``.venv`` in the clone and runs ``make test`` with its Python, not the machine's: the
    packages of the machine's Python would hide a test that fails in the venv the README's lines create."""
    clone = tmp_path / "clone"
    (clone / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", clone / ".ci" / "run")
    (clone / "slurm").mkdir()
    (clone / "slurm" / "local_cluster.sh").write_text("exit 1\n")  # no cluster here: the run says so and goes on
    (clone / ".make-installed").write_text("")  # a stamp of another interpreter's install
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "make").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "make_args"}\n')
    (stubs / "make").chmod(0o755)
    env = {**os.environ, "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", str(clone / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "make_args").read_text().split() == ["test", "PYTHON=.venv/bin/python"]
    assert (clone / ".venv" / "bin" / "python").is_file() and not (clone / ".make-installed").exists()
    assert ".venv/" in (ROOT / ".gitignore").read_text().splitlines()
