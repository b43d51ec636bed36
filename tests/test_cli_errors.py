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
