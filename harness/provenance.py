"""Where and with what a figure was made: the machine, the library versions, the commit and the weights.

Benchmarks print it beside every ratio, and each experiment record (``experiments/records.py``) keeps it
as fields, so a figure names its processor (and its bf16/AMX units), or its GPU, without prose.
"""
from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("torch", "transformers", "lightning", "sentence-transformers")


def _cpuinfo(field: str) -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    return set((_cpuinfo("flags") or "").split())


def bf16_units() -> list[str]:
    """The CPU's bf16 and AMX flags (``avx512_bf16``, ``amx_bf16``, ...): what decides bf16's speed on a CPU."""
    return sorted(f for f in cpu_flags() if "bf16" in f or f.startswith("amx"))


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def gpu() -> str | None:
    """The CUDA device's name, or None (no torch import when torch is not loaded yet: that costs seconds)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine(threads: int | None = None) -> dict:
    """``{"cpu", "bf16_units", "cores", "threads", "gpu"}``: threads are the torch threads of the work."""
    if threads is None:
        try:
            import torch

            threads = torch.get_num_threads()
        except ImportError:
            threads = None
    return {"cpu": cpu_model(), "bf16_units": bf16_units(), "cores": cores(), "threads": threads, "gpu": gpu()}


def versions() -> dict[str, str | None]:
    """Python and the libraries that decide a figure, as installed."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def commit(root: Path = ROOT) -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it; None outside a git clone."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def weights_digest(module) -> str:
    """The first 16 hex digits of a SHA-256 over ``module``'s state dict (each name, dtype, shape and the values'
    bytes, in the dict's order): two evaluations with one digest scored the same weights, whatever the file,
    its path or the training state saved beside them."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]
