"""The CPU engine. Its kernels are compiled by numba and cached on disk, and numba keys a cached
function on the stamp of its own file only, while these kernels are compiled into each other
across files (amx.py and guess.py take kernels.py's, so does sampling.py): after kernels.py
changed, amx.py's cached kernels kept the old code. So their cache lives in a folder named by a
hash of all their sources (unless NUMBA_CACHE_DIR says where): any change compiles them afresh."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from numba.core import config

KERNEL_SOURCES = ("engine/kernels.py", "engine/amx.py", "engine/guess.py", "sampling.py")  # under specdec/


def kernel_cache_dir(package: Path) -> Path:
    """Where the kernels of the specdec package at `package` are cached: a folder of its
    engine's __pycache__ named by a hash of KERNEL_SOURCES."""
    digest = hashlib.sha256()
    for source in KERNEL_SOURCES:
        digest.update((package / source).read_bytes())
    return package / "engine" / "__pycache__" / f"numba-{digest.hexdigest()[:16]}"


if not os.environ.get("NUMBA_CACHE_DIR"):  # read by numba as each cached kernel is defined
    config.CACHE_DIR = str(kernel_cache_dir(Path(__file__).resolve().parent.parent))
