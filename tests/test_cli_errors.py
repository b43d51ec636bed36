"""The command lines refuse what they do not know: one ``error:`` line first, naming the key and the
nearest valid one, then one hint; no prefix of an option stands for it."""
from __future__ import annotations

import pytest

import evaluate
import train
from harness.arguments import resolve_config_args, shipped_config_dir, shipped_configs


def errors_of(main, args, capsys) -> list[str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert "usage:" not in captured.err  # no usage block before or after the error
    return captured.err.strip().splitlines()


def test_an_abbreviated_option_is_refused_with_the_full_one(capsys):
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--trainer.max_step", "10"], capsys)
    assert lines == ["error: unknown option --trainer.max_step; did you mean --trainer.max_steps?",
                     "(run with --help for every option)"]


@pytest.mark.parametrize("typo, meant", [
    ("model.init_args.encodr.init_args.pooling", "model.init_args.encoder.init_args.pooling"),
    ("model.init_args.encoder.init_args.poolng", "model.init_args.encoder.init_args.pooling"),
    ("data.init_args.per_device_batch_sise", "data.init_args.per_device_batch_size"),
])
def test_a_nested_key_typo_names_the_key_and_the_nearest(typo, meant, capsys):
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", f"--{typo}", "8"], capsys)
    assert lines[0] == f"error: unknown option --{typo}; did you mean --{meant}?" and len(lines) == 2


def test_a_wrong_value_names_its_full_key(capsys):
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml",
                                   "--model.init_args.encoder.init_args.pooling", "meen"], capsys)
    assert lines[0].startswith("error: --model.init_args.encoder.init_args.pooling: Expected a typing.Literal[")
    assert lines[0].endswith("Got value: meen")


def test_a_missing_config_lists_the_shipped_ones(capsys):
    lines = errors_of(train.main, ["--config", "configs/sbert_nli_sofmax.yaml"], capsys)
    assert lines[0].startswith("error: --config ") and "sbert_nli_sofmax.yaml: no such file" in lines[0]
    assert "sbert_nli_softmax.yaml" in lines[0] and "dclr/official.yaml" in lines[0]
    assert {"quickstart.yaml", "overlays/offline_wiki.yaml"} <= set(shipped_configs())


def test_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = resolve_config_args(["--config", "configs/quickstart.yaml", "--config=overlays/cpu_300_steps.yaml",
                                "--trainer.max_steps", "3"])
    assert args == ["--config", str(shipped_config_dir() / "quickstart.yaml"),
                    f"--config={shipped_config_dir() / 'overlays' / 'cpu_300_steps.yaml'}", "--trainer.max_steps", "3"]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "quickstart.yaml").write_text("seed_everything: 1\n")
    assert resolve_config_args(["--config", "configs/quickstart.yaml"])[1] == "configs/quickstart.yaml"  # the user's


def test_help_opens_with_the_project_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    head = out[: out.index("options:")]
    assert head.count("python train.py --config configs/") == 3
    assert out.index("python train.py --config") < out.index("--trainer.max_steps MAX_STEPS")


def test_evaluate_refuses_abbreviations_and_names_the_option(capsys):
    lines = errors_of(evaluate.main, ["--mod", "x", "--sts_dir", "tests/fixtures/sts"], capsys)
    assert lines == ["error: unknown option --mod; did you mean --model?", "(run with --help for every option)"]


# -- the same typos written in a config file -----------------------------------------------------------------
@pytest.mark.parametrize("overlay, line, message", [
    ("trainer:\n  max_step: 10\n", 2, "unknown key trainer.max_step; did you mean trainer.max_steps?"),
    ("model:\n  init_args:\n    lrr: 1.0e-5\n", 3,
     "unknown key model.init_args.lrr (STSRegression takes no 'lrr'); did you mean model.init_args.lr?"),
    ("model:\n  init_args:\n    encoder:\n      init_args:\n        model_nme: x\n", 5,
     "unknown key model.init_args.encoder.init_args.model_nme (SentenceEncoder takes no 'model_nme'); "
     "did you mean model.init_args.encoder.init_args.model_name?"),
    ("model:\n  class_path: lightning_modules.STSRegresion\n", 2,
     "model.class_path: no class lightning_modules.STSRegresion; did you mean lightning_modules.STSRegression?"),
    ("data:\n  class_path: datamodules.STSDataModule\n  init_args:\n    per_device_batch_sise: 8\n", 4,
     "unknown key data.init_args.per_device_batch_sise (STSDataModule takes no 'per_device_batch_sise'); "
     "did you mean data.init_args.per_device_batch_size?"),
], ids=["trainer", "model", "encoder", "class_path", "data"])
def test_a_config_file_typo_names_the_file_line_key_and_nearest(tmp_path, capsys, overlay, line, message):
    path = tmp_path / "overlay.yaml"
    path.write_text(overlay)
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", str(path)], capsys)
    assert lines == [f"error: {path}:{line}: {message}", "(run with --help for every option)"]


def test_print_config_refuses_what_a_run_refuses(tmp_path, capsys):
    path = tmp_path / "overlay.yaml"
    path.write_text("trainer:\n  precison: 32\n")
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", str(path), "--print_config"],
                      capsys)
    assert lines[0] == f"error: {path}:2: unknown key trainer.precison; did you mean trainer.precision?"
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--print_config", "--trainer.precison",
                                   "32"], capsys)
    assert lines[0] == "error: unknown option --trainer.precison; did you mean --trainer.precision?"


def test_a_class_path_typo_on_the_command_line_names_the_nearest_class(capsys):
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--model", "lightning_modules.MNRR"],
                      capsys)
    assert lines[0] == ("error: the command line: model.class_path: no class lightning_modules.MNRR; did you mean "
                        "lightning_modules.MNR?")


def test_the_file_check_refuses_only_what_the_parser_refuses():
    """Every paper config, alone and under each overlay: where jsonargparse accepts the merged configs, the file
    check does too (it refuses nothing that trains); where the check refuses, the parser refuses as well."""
    from argparse import ArgumentError

    from datamodules import SentenceDataModule
    from harness.arguments import CommandLineError
    from harness.cli import SentenceCLI
    from harness.config_files import check_config_files
    from lightning_modules.base import SentenceEmbeddingModule

    found = {}

    class Parser(SentenceCLI):
        def parse_arguments(self, parser, args):
            found["parser"] = parser
            raise SystemExit(0)

    with pytest.raises(SystemExit):
        Parser(args=["--config", "configs/quickstart.yaml"])
    parser = found["parser"]
    keys = {str(k) for k in parser.get_defaults().keys()}
    root = shipped_config_dir()
    papers = [c for c in shipped_configs() if "/" not in c]
    overlays = [c for c in shipped_configs() if "/" in c]
    subclasses = {"model": SentenceEmbeddingModule, "data": SentenceDataModule}
    accepted = 0
    for paper in papers:
        for overlay in [None, *overlays]:
            argv = ["--config", str(root / paper)] + (["--config", str(root / overlay)] if overlay else [])
            try:
                parser.parse_args(argv)
                parses = True
            except ArgumentError:
                parses = False
            try:
                check_config_files(argv, keys, subclasses)
                checked = True
            except CommandLineError:
                checked = False
            assert checked or not parses, (paper, overlay)
            accepted += parses
    assert accepted > len(papers)  # the papers alone and many overlay pairs parse


def test_an_evaluate_config_file_typo_names_the_file_and_the_nearest(tmp_path, capsys):
    path = tmp_path / "evaluate.yaml"
    path.write_text("precision: bf16\nsts_dri: data/sts\n")
    lines = errors_of(evaluate.main, ["--config", str(path), "--model", "x"], capsys)
    assert lines[0] == f"error: {path}:2: unknown key sts_dri; did you mean sts_dir?"


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "stage.py", "experiments/reproduce.py"])
def test_every_command_names_itself_and_shows_an_offline_example(script):
    import subprocess
    import sys

    from tests.conftest import ROOT

    result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"usage: {script.rsplit('/', 1)[-1]}" in result.stdout
    assert "SENTEMB_DATA" in result.stdout and "HF_HUB_OFFLINE=1" in result.stdout
    if script == "train.py":  # the common options on a screen; --help_all for every option
        assert len(result.stdout.splitlines()) < 60 and "--help_all" in result.stdout


# -- a config that is not one, a value that is not valid, a negative number ----------------------------------
def test_a_config_that_is_not_yaml_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "overlay.yaml"
    path.write_text("trainer:\n  max_steps: 10\nmodel: [a, b\ndata: 1\n")
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", str(path)], capsys)
    assert lines[0].startswith(f"error: {path}:4: not valid YAML: ") and "expected ',' or ']'" in lines[0]


def test_a_table_given_as_a_config_is_named_as_one(tmp_path, capsys):
    table = "tests/fixtures/sts/stsb.dev.tsv"
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", table], capsys)
    assert lines[0].startswith(f"error: {table}: not a config: it reads as a table of data (tab-separated")


def test_a_config_that_holds_no_mapping_is_refused(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("- model\n- data\n")
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", str(path)], capsys)
    assert lines[0].startswith(f"error: {path}: not a config: ") and "a list" in lines[0]


def test_a_wrong_value_in_a_config_file_names_the_key_line_and_nearest_value(tmp_path, capsys):
    path = tmp_path / "overlay.yaml"
    path.write_text("model:\n  init_args:\n    encoder:\n      init_args:\n        pooling: maen\n")
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", str(path)], capsys)
    assert lines[0].startswith(f"error: {path}:5: model.init_args.encoder.init_args.pooling: 'maen' is not one of ")
    assert lines[0].endswith("; did you mean mean?")


def test_a_negative_number_as_its_own_argument_is_a_value(tmp_path, capsys):
    from harness.cli import SentenceCLI

    cli = SentenceCLI(args=["--config", "configs/quickstart.yaml", "--model.init_args.alignment_threshold", "-1e-1",
                            "--trainer.default_root_dir", str(tmp_path)])
    assert cli.model.hparams.alignment_threshold == -0.1
    # the value reaches the objective, which says what is wrong with it
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--model.init_args.lr", "-1e-5"], capsys)
    assert [line for line in lines if line.startswith("error:")] == ["error: lr must be positive, got -1e-05"]


def test_a_bare_batch_size_is_offered_the_training_one(tmp_path, capsys):
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--data.init_args.batch_sise", "8"], capsys)
    assert lines[0] == ("error: unknown option --data.init_args.batch_sise; did you mean "
                        "--data.init_args.per_device_batch_size?")
    path = tmp_path / "overlay.yaml"
    path.write_text("data:\n  init_args:\n    batch_sise: 8\n")
    lines = errors_of(train.main, ["--config", "configs/quickstart.yaml", "--config", str(path)], capsys)
    assert lines[0].endswith("did you mean data.init_args.per_device_batch_size?")


@pytest.mark.parametrize("word, choices, meant", [
    ("batch_sise", ["eval_batch_size", "per_device_batch_size", "max_length"], "per_device_batch_size"),
    ("eval_batch_sise", ["eval_batch_size", "per_device_batch_size"], "eval_batch_size"),
    ("data.init_args.batch_size", ["data.init_args.eval_batch_size", "data.init_args.per_device_batch_size"],
     "data.init_args.per_device_batch_size"),
    ("trainer.max_step", ["trainer.max_steps", "trainer.max_epochs", "trainer.min_steps"], "trainer.max_steps"),
    ("lrr", ["lr", "temperature", "weight_decay"], "lr"),
    ("model.init_args.encodr.init_args.pooling", ["model.init_args.encoder.init_args.pooling", "model.init_args.lr"],
     "model.init_args.encoder.init_args.pooling"),
    ("zzz", ["lr", "temperature"], None),
])
def test_the_nearest_key_reads_words_not_letters(word, choices, meant):
    from harness.arguments import nearest

    assert nearest(word, choices) == meant


def test_the_configs_command_answers_help(capsys):
    from harness.arguments import print_shipped_configs

    with pytest.raises(SystemExit) as exit_info:
        print_shipped_configs(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and "shipped configs" in out and "quickstart.yaml" not in out
    with pytest.raises(SystemExit) as exit_info:
        print_shipped_configs(["--lst"])
    assert exit_info.value.code == 2
    print_shipped_configs([])
    assert "quickstart.yaml" in capsys.readouterr().out


INSTALLED = {"sentemb-train": "harness.launch:train", "sentemb-evaluate": "harness.launch:evaluate",
             "sentemb-stage": "harness.stage:main"}


def _installed(command: str, *args: str, cwd, **env: str):
    """``command`` as a wheel's entry point runs it: its own name in argv[0], from a folder outside the clone."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    module, function = INSTALLED[command].split(":")
    code = f"import sys; sys.argv[0] = {command!r}; from {module} import {function}; sys.exit({function}())"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})


@pytest.mark.parametrize("command", list(INSTALLED))
def test_the_installed_help_names_no_file_a_wheel_lacks(command, tmp_path):
    import re

    result = _installed(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout
    assert f"usage: {command}" in text
    assert not re.search(r"python (train|evaluate|stage)\.py", text)
    named = [text[:m.start()].split()[-2:] for m in re.finditer(r"docs/\w+\.md", text)]
    assert named and all(before[-2:] == ["the", "repository's"] or before[-1].endswith("repository's")
                         for before in named), named


def test_the_first_example_of_the_installed_help_runs_without_the_hub(tmp_path, tiny_model_dir):
    text = _installed("sentemb-train", "--help", cwd=tmp_path).stdout
    examples = text.split("examples:\n", 1)[1].splitlines()
    first = next(line.strip() for line in examples if line.strip() and not line.strip().startswith("#"))
    assert first.startswith("sentemb-train --config configs/")
    run = _installed("sentemb-train", *first.split()[1:], "--trainer.max_steps", "1", "--validate_first", "false",
                     "--model.init_args.encoder.init_args.model_name", tiny_model_dir,
                     "--trainer.default_root_dir", str(tmp_path / "runs"), cwd=tmp_path,
                     HF_HUB_OFFLINE="1", HF_ENDPOINT="http://127.0.0.1:9")
    assert run.returncode == 0, run.stderr[-3000:]
    assert list((tmp_path / "runs").glob("lightning_logs/*/checkpoints/*.ckpt"))


def _readme_commands(prefix: str) -> list[list[str]]:
    import re
    import shlex

    from tests.conftest import ROOT

    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [shlex.split(line.split("#", 1)[0])[2:] for block in blocks for line in block.splitlines()
            if line.startswith(prefix)]


def test_the_readme_opens_with_the_two_commands():
    from tests.conftest import ROOT

    text = (ROOT / "README.md").read_text()
    first = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make quickstart", "make test"]
    assert text.index("make quickstart") < text.index("## Install")


def test_the_tours_first_command_needs_no_hub(monkeypatch):
    """The README's first ``python train.py`` line passes the hub check with the hub unreachable; a paper config
    does not (the check is live)."""
    from huggingface_hub import constants

    from encoders.hub import hub_unreachable_reason
    from harness.launch import hub_error

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    hub_unreachable_reason.cache_clear()
    first = _readme_commands("python train.py")[0]
    assert hub_error(first) is None, first
    assert "cannot be reached" in hub_error(["--config", "configs/sbert_sts_regression.yaml"])
