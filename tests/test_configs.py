"""Shipped configs cannot drift: every one parses, overlays merge, and no key repeats the code's default."""
from __future__ import annotations

import glob
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

CONFIGS = sorted(glob.glob(str(ROOT / "configs" / "*.yaml")))
# configs/overlays/ point any paper config elsewhere (e.g. at the offline model, which is also the code's
# default): a key there overrides a base's value, so the code's default is no reason to drop it.
OVERLAYS = sorted(o for o in glob.glob(str(ROOT / "configs" / "*" / "*.yaml")) if Path(o).parent.name != "overlays")


def class_defaults(class_path: str) -> dict[str, Any]:
    """Init defaults of a class, following ``**kwargs`` to its base classes as jsonargparse does."""
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.default is not inspect.Parameter.empty:
                defaults[parameter.name] = parameter.default
            else:
                defaults.pop(parameter.name, None)
    return defaults


def same(value: Any, default: Any) -> bool:
    if isinstance(default, tuple):
        default = list(default)
    return type(value) is type(default) and value == default or (
        isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(default, (int, float))
        and not isinstance(default, bool) and float(value) == float(default))


def keys_at_default(node: Any, class_path: str | None, where: str) -> list[str]:
    """``where.key`` for every init argument set to its class's default, recursively through nested classes."""
    found = []
    if not isinstance(node, dict):
        return found
    class_path = node.get("class_path", class_path)
    args = node.get("init_args") or {}
    defaults = class_defaults(class_path) if class_path else {}
    for key, value in args.items():
        if isinstance(value, dict) and ("init_args" in value or "class_path" in value):
            nested = value.get("class_path") or NESTED.get(key)
            found += keys_at_default(value, nested, f"{where}.{key}")
        elif key in defaults and same(value, defaults[key]):
            found.append(f"{where}.{key}: {value!r}")
    return found


NESTED = {"encoder": "encoders.SentenceEncoder"}  # an overlay's init_args-only encoder section


def config_keys_at_default(path: str, base: dict | None = None) -> list[str]:
    config = yaml.safe_load(Path(path).read_text()) or {}
    found = []
    for section in ("model", "data"):
        class_path = (config.get(section) or {}).get("class_path") or ((base or {}).get(section) or {}).get("class_path")
        found += keys_at_default(config.get(section) or {}, class_path, section)
    return found


@pytest.mark.parametrize("config", CONFIGS + OVERLAYS, ids=lambda p: str(Path(p).relative_to(ROOT / "configs")))
def test_no_config_key_repeats_the_default(config):
    base = None
    if Path(config).parent.name == "dclr":
        base = yaml.safe_load((ROOT / "configs" / "dclr.yaml").read_text())
    assert config_keys_at_default(config, base) == []


# -- what the docs say of the configs ------------------------------------------------------------------------
PRECISION_WORDS = {"32": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def _config_rows(page: str) -> dict[str, str]:
    """``name.yaml`` -> its row of a page's config table (rows that open with a config's name in backticks)."""
    rows = {}
    for line in (ROOT / page).read_text().splitlines():
        if line.startswith("| `") and ".yaml`" in line.split("|")[1]:
            rows[line.split("`")[1].rsplit("/", 1)[-1]] = line
    return rows


@pytest.mark.parametrize("page", ["README.md", "docs/TRAINING.md"])
def test_a_config_row_names_no_precision_the_config_does_not_run(page):
    for name, row in _config_rows(page).items():
        path = ROOT / "configs" / name
        if not path.is_file():
            continue
        precision = str(((yaml.safe_load(path.read_text()) or {}).get("trainer") or {}).get("precision", "32"))
        others = set(PRECISION_WORDS.values()) - {PRECISION_WORDS[precision]}
        said = [w for w in others if re.search(rf"\b{w}\b", row.split("|", 2)[2])]
        assert said == [], f"{page}: the row of {name} says {said}, the config runs {precision}"


def test_the_cpu_budget_runs_in_the_studies_precision():
    def precision(name: str) -> str:
        return str(yaml.safe_load((ROOT / "configs" / "overlays" / name).read_text())["trainer"]["precision"])

    assert precision("cpu_300_steps.yaml") == precision("cpu_dev_choice.yaml") == "32"


def test_the_readme_names_every_shipped_overlay():
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `overlays/"))
    named = set(re.findall(r"`(\w+)`", row))
    for group in re.findall(r"`(\w+)_\{([\w,]+)\}`", row):
        named |= {f"{group[0]}_{part}" for part in group[1].split(",")}
    shipped = {p.stem for p in (ROOT / "configs" / "overlays").glob("*.yaml")}
    assert shipped - named == set()
