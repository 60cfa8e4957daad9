"""Content fingerprints: what an output was computed from, by its bytes, not its path.

A model folder whose weights were replaced, or a dataset re-imported in place, keeps its
path; a cache, a resumed policy or a results table tied to the path would silently mix
the old and the new. Outputs record these fingerprints instead (train's reference cache
key, an oracle part's run identity, run.json's dataset) and refuse a mismatch.

Hashing a 270 MB GGUF takes about a second, so each file's sha256 is remembered by (real
path, size, mtime, inode) in ``$XDG_CACHE_HOME/basis-bench/sha256.json`` (default
``~/.cache``); an unwritable cache is skipped, never an error.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json, outputs, provenance
from basis_bench.guards.folders import read_small

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
NOT_WEIGHTS = ("trainer_state.pt",)  # a training checkpoint's optimizer and RNG state
_MEMORY: dict[str, str] = {}


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "basis-bench" / "sha256.json"


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"


def _load_cache() -> dict[str, str]:
    try:  # a FIFO by the cache's name was opened and waited on for good; now: no cache
        data = bounded_json.loads((read_small(_cache_file()) or b"{}").decode("utf-8"))
    except (InputError, OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def _save_cache(entries: dict[str, str]) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        outputs.write_text_atomic(path, outputs.json_text({**_load_cache(), **entries}))
    except OSError:
        pass  # a cache only: a read-only HOME hashes again next time


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a file's bytes, remembered by (path, size, mtime, inode)."""
    return files_sha256([Path(path)])[0]


def files_sha256(paths: Iterable[Path]) -> list[str]:
    """sha256 of each file's bytes (one cache read and write for all of them)."""
    paths = list(paths)
    keys = [_key(p) for p in paths]
    if any(k not in _MEMORY for k in keys):
        _MEMORY.update(_load_cache())
    new: dict[str, str] = {}
    for path, key in zip(paths, keys, strict=True):
        if key not in _MEMORY:
            new[key] = _MEMORY[key] = provenance.file_sha256(path)
    if new:
        _save_cache(new)
    return [_MEMORY[k] for k in keys]


def tree_sha256(root: Path, files: Iterable[Path]) -> str:
    """One sha256 over ``files`` (named relative to ``root``) and their contents."""
    files = sorted(files)
    lines = (
        f"{f.relative_to(root).as_posix()}\t{h}\n"
        for f, h in zip(files, files_sha256(files), strict=True)
    )
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def weights_sha256(path: str | os.PathLike[str]) -> str | None:
    """The fingerprint of a model: its weight files' bytes (a GGUF file, or a folder's
    ``*.safetensors``/``*.bin``/``*.pt``/``*.gguf`` files) and its ``config.json``; None
    for a model that is not a local file or folder (a hub name)."""
    path = Path(path)
    if not path.exists():
        return None
    if path.is_file():
        return tree_sha256(path.parent, [path])
    files = [
        f
        for f in path.iterdir()
        if f.is_file()
        and not f.name.startswith(".")
        and f.name not in NOT_WEIGHTS
        and (f.suffix in WEIGHT_SUFFIXES or f.name == "config.json")
    ]
    return tree_sha256(path, files)


def dataset_sha256(root: str | os.PathLike[str]) -> str:
    """The fingerprint of a rollouts dataset: its prompts.parquet and every rollouts file,
    by name and bytes (an import --replace or an oracle run into it changes it)."""
    from basis_bench.rollouts.store import rollout_files
    from basis_bench.schema import PROMPTS_FILE

    root = Path(root)
    prompts = [root / PROMPTS_FILE] if (root / PROMPTS_FILE).is_file() else []
    return tree_sha256(root, [*prompts, *rollout_files(root)])


def model_difference(old: object, new: object) -> str | None:
    """How two run identities' ``model`` records differ: None (one model), "model weights"
    (both hold a fingerprint: a moved folder is the same model, a folder whose weights were
    replaced is not) or "model" (records written before fingerprints: as recorded)."""
    if isinstance(old, dict) and isinstance(new, dict):
        if old.get("weights") and new.get("weights"):
            return None if old["weights"] == new["weights"] else "model weights"
        if not old.get("weights"):
            new = {k: v for k, v in new.items() if k != "weights"}
    return None if old == new else "model"
