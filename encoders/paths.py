"""Where files are: the data root a config names as ``${SENTEMB_DATA}``, and the shipped configs' folder.

Light on purpose (no datasets, no torch): the command lines read it in their first second.
"""
from __future__ import annotations

import os
import re
from pathlib import Path


class PathError(ValueError):
    """A placeholder in a path that cannot be filled (its message says how to fill it)."""


# -- the data root and the shipped files ----------------------------------------------------------------------
DATA_ROOT = "SENTEMB_DATA"  # the environment variable of the data root the offline overlays read
SHIPPED = "SENTEMB_CONFIGS"  # the shipped configs' folder (its quickstart/ holds the quickstart's sample rows)
_PLACEHOLDER = re.compile(r"\$\{(SENTEMB_DATA|SENTEMB_CONFIGS)\}|\$(SENTEMB_DATA|SENTEMB_CONFIGS)\b")


def shipped_config_dir() -> Path | None:
    """The folder of the shipped configs: the clone's ``configs/``, else the installed ``sentemb_configs``."""
    clone = Path(__file__).resolve().parent.parent / "configs"  # encoders/ sits beside configs/ in a clone
    if clone.is_dir():
        return clone
    try:
        import sentemb_configs
    except ImportError:
        return None
    return Path(sentemb_configs.__file__).parent


def data_path(value: str) -> str:
    """A path of a config with its placeholders filled in: ``${SENTEMB_DATA}`` is the data root (the environment
    variable: the folder that ``stage.py`` fills, in the layout of docs/DATA.md), ``${SENTEMB_CONFIGS}`` the
    shipped configs' folder, in a clone or an installed package. Other text is returned as it is."""
    if "SENTEMB_" not in value:
        return value

    def fill(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name == SHIPPED:
            root = shipped_config_dir()
            if root is None:
                raise PathError(f"{value}: the shipped configs' folder is not installed (sentemb_configs)")
            return str(root)
        root = os.environ.get(DATA_ROOT)
        if not root:
            raise PathError(f"{value}: {DATA_ROOT} is not set; it is the data root that the offline overlays read "
                            f"(export {DATA_ROOT}=DIR, a folder in the layout of docs/DATA.md, which stage.py writes), "
                            "or give the path itself")
        return root.rstrip("/")

    return _PLACEHOLDER.sub(fill, value)
