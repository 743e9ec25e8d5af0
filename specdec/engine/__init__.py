"""The PyTorch engine: the model, its KV cache, its kernels, its sampling and verification;
self-contained (it imports no other part of specdec but the leaf modules).

Its CPU kernels are compiled by numba and cached on disk, and numba keys a cached function on the
stamp of its own file only, while these kernels are compiled into each other across files (amx.py,
guess.py and sampling.py take kernels.py's): after kernels.py changes, amx.py's cached kernels
would keep the old code. So their cache lives in a folder named by a hash of all their sources
(unless NUMBA_CACHE_DIR says where): any change compiles them afresh."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba.core import config

KERNEL_SOURCES = ("kernels.py", "amx.py", "guess.py", "sampling.py")  # in this folder


def kernel_cache_dir(engine: Path) -> Path:
    """Where the kernels of the engine package at `engine` are cached: a folder of its
    __pycache__ named by a hash of KERNEL_SOURCES."""
    digest = hashlib.sha256()
    for source in KERNEL_SOURCES:
        digest.update((engine / source).read_bytes())
    return engine / "__pycache__" / f"numba-{digest.hexdigest()[:16]}"


if not os.environ.get("NUMBA_CACHE_DIR"):  # read by numba as each cached kernel is defined
    config.CACHE_DIR = str(kernel_cache_dir(Path(__file__).resolve().parent))
