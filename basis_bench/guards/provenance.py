"""Where a result came from: ``__version__`` (the package's, which every output records),
:func:`provenance` (package version, git commit, date, argv, versions) and :func:`file_sha256`, which ties a table, an import's source or a converted
checkpoint to the bytes it was made from."""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import subprocess
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

__version__ = "0.1.0"  # pyproject.toml's version (tests/test_packaging.py checks they agree)
PROVENANCE_PACKAGES = ("numpy", "polars", "pyarrow", "torch", "transformers", "math-verify")


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file, read in 1 MiB blocks: how run.json ties tables to their run, how an
    import records its sources, and the key of a converted checkpoint."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def provenance() -> dict[str, Any]:
    """Where a result came from: package version, git commit (when run from a clone, with a
    ``-dirty`` suffix for uncommitted changes), UTC date, argv, python and library versions.
    Recorded in every run.json and training config.json."""
    root = Path(__file__).resolve().parents[2]  # the clone: basis_bench/guards/ is two below
    commit = None
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=40"],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = None
    versions: dict[str, str | None] = {}
    for name in PROVENANCE_PACKAGES:
        try:
            versions[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "basis_bench": __version__,
        "git_commit": commit,
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "python": platform.python_version(),
        "versions": versions,
    }
