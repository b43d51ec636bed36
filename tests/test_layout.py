"""The layout's rules: imports only go down the layers, and data and objective meet through a checked contract."""
from __future__ import annotations

import ast
import glob
from pathlib import Path

import pytest

import train
from datamodules import FILMDataModule, NLIDataModule, STSDataModule, WikiDataModule
from encoders.sentence import SentenceEncoder
from lightning_modules import DCLR, MNR, FILMObjective, NLISoftmax, SimCSE, STSRegression, Triplet
from tests.conftest import ROOT
from tests.test_train import objective_config

# Lowest first: a package may import its own layer and those below it, never one above. The encoders
# stand alone (a model needs no data module); the data modules use their padding rule.
LAYERS = ["encoders", "datamodules", "lightning_modules", "harness", "scripts"]
SCRIPTS = {"train", "evaluate", "stage", "mine", "benchmarks", "experiments", "notebooks", "tests"}


def layer_of(module: str) -> str | None:
    top = module.split(".")[0]
    if top in SCRIPTS:
        return "scripts"
    return top if top in LAYERS else None


def absolute_imports(path: Path) -> list[tuple[ast.AST, list[str]]]:
    """Each absolute import statement of a file, with the module names it imports."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.append((node, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node, [node.module]))
    return found


def upward_imports(root: Path) -> list[str]:
    """``file: imports X`` for every import in a library package that reaches a higher layer."""
    found = []
    for package in LAYERS[:-1]:
        for path in sorted((root / package).rglob("*.py")):
            here = LAYERS.index(package)
            for node, names in absolute_imports(path):
                for name in names:
                    layer = layer_of(name)
                    if layer is not None and LAYERS.index(layer) > here:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: imports {name}")
    return found


def test_no_import_goes_upward():
    assert upward_imports(ROOT) == []


def test_the_import_check_catches_an_upward_import(tmp_path):
    for package in LAYERS[:-1]:
        (tmp_path / package).mkdir()
    (tmp_path / "datamodules" / "bad.py").write_text("from lightning_modules.mnr import MNR\n")
    (tmp_path / "encoders" / "bad.py").write_text("import harness.cli\nfrom datamodules.batching import PadCollator\n")
    (tmp_path / "harness" / "bad.py").write_text("def f():\n    import train\n")
    assert upward_imports(tmp_path) == [
        "encoders/bad.py:1: imports harness.cli",
        "encoders/bad.py:2: imports datamodules.batching",
        "datamodules/bad.py:1: imports lightning_modules.mnr",
        "harness/bad.py:2: imports train",
    ]


# Two rooms on one floor: the studies and the speed benchmarks share helpers from a layer below (harness),
# never from each other. A benchmark imports its siblings by bare name (``from common import ...``), so a bare
# name of the other folder's modules counts too.
SIBLINGS = ("experiments", "benchmarks")


def sibling_imports(root: Path) -> list[str]:
    """``file:line: imports X`` for every import of experiments/ from benchmarks/ and the other way round."""
    found = []
    for here, other in (SIBLINGS, SIBLINGS[::-1]):
        theirs = {p.stem for p in (root / other).glob("*.py")} - {"__init__"}
        for path in sorted((root / here).rglob("*.py")):
            for node, names in absolute_imports(path):
                for name in names:
                    top = name.split(".")[0]
                    if top == other or top in theirs:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: imports {name}")
    return found


def test_experiments_and_benchmarks_never_import_each_other():
    assert sibling_imports(ROOT) == []


def test_the_sibling_check_catches_both_directions(tmp_path):
    for folder in SIBLINGS:
        (tmp_path / folder).mkdir()
    (tmp_path / "benchmarks" / "common.py").write_text("from harness.measurement import machine\n")
    (tmp_path / "experiments" / "study.py").write_text(
        "def f():\n    from benchmarks.common import write_record\nimport common\n")
    (tmp_path / "benchmarks" / "speed.py").write_text("from common import machine\nimport experiments.stats\n")
    assert sibling_imports(tmp_path) == [
        "experiments/study.py:3: imports common",
        "experiments/study.py:2: imports benchmarks.common",
        "benchmarks/speed.py:2: imports experiments.stats",
    ]


def module_imports(root: Path) -> dict[str, set[str]]:
    """Module -> the library modules it imports, at any depth of its code (function-level imports too)."""
    modules = {str(p.relative_to(root).with_suffix("")).replace("/", "."): p
               for package in LAYERS[:-1] for p in (root / package).rglob("*.py")}
    modules = {m.removesuffix(".__init__"): p for m, p in modules.items()}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None or \
                    isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            else:
                continue
            found |= {n for n in names if n in modules and n != module}
        graph[module] = found
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle (as the modules along it), found by depth-first search."""
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycle_between_library_modules():
    assert import_cycles(module_imports(ROOT)) == []


def test_the_cycle_check_finds_a_function_level_cycle(tmp_path):
    for package in LAYERS[:-1]:
        (tmp_path / package).mkdir()
    (tmp_path / "encoders" / "a.py").write_text("from .b import f\n")
    (tmp_path / "encoders" / "b.py").write_text("def f():\n    from encoders.a import g\n")
    assert import_cycles(module_imports(tmp_path)) == [["encoders.a", "encoders.b", "encoders.a"]]


@pytest.mark.parametrize("objective, datamodule, ok", [
    (NLISoftmax, NLIDataModule(["x"], view="labelled"), True),
    (NLISoftmax, NLIDataModule(["x"], view="pairs"), False),
    (STSRegression, STSDataModule("x"), True),
    (Triplet, NLIDataModule(["x"], view="pairs"), False),
    (MNR, NLIDataModule(["x"], view="pairs"), True),
    (MNR, NLIDataModule(["x"], view="triplets"), True),
    (MNR, STSDataModule("x"), False),
    (SimCSE, WikiDataModule("x"), True),
    (SimCSE, NLIDataModule(["x"], view="triplets"), True),
    (SimCSE, NLIDataModule(["x"], view="pairs"), False),
    (DCLR, WikiDataModule("x"), True),
    (DCLR, NLIDataModule(["x"], view="triplets"), False),
    (FILMObjective, FILMDataModule(["x"]), True),
    (FILMObjective, WikiDataModule("x"), False),
    (MNR, FILMDataModule(["x"]), False),
])
def test_contract_between_objective_and_data(objective, datamodule, ok):
    if ok:
        datamodule.check_objective(objective)
        assert datamodule.unique_sentences == objective.needs_unique_sentences
    else:
        with pytest.raises(ValueError, match=rf"{objective.__name__} trains on batch keys .* but {type(datamodule).__name__} gives"):
            datamodule.check_objective(objective)


def test_mismatched_config_fails_before_any_work(tmp_path, tiny_model_dir, fixtures_dir, capsys):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "MNR", "NLIDataModule",
                              data_args={"view": "labelled"})
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", config])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: MNR trains on batch keys anchor, positive, but NLIDataModule gives sentence1, sentence2, label" in err
    assert not glob.glob(str(tmp_path / "runs" / "**" / "*.ckpt"), recursive=True)


def test_tokenizer_reaches_the_data_through_the_cli(tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "MNR", "NLIDataModule",
                              data_args={"view": "pairs"}, encoder_args={"max_seq_length": 12})
    cli = train.SentenceCLI(args=["--config", config])
    encoder: SentenceEncoder = cli.model.encoder
    assert cli.datamodule.tokenizer is encoder.tokenizer
    assert (cli.datamodule.max_length, cli.datamodule.eval_max_length) == (12, encoder.eval_max_length)
