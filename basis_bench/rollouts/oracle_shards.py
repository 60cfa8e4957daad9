"""The settings of the oracle shards running into one dataset, compared before any samples.

A part records its run's settings (:func:`~basis_bench.rollouts.oracle.pending_chunks`
compares them), but only once written: two shards of one policy started at one instant
with different settings both found no part and mixed their rows in one policy. So each
shard also publishes its settings in a file of its own at the dataset's root,
``.oracle-shard.XXXX.json``, which it holds locked (``fcntl.lockf``) while it runs and
removes when it ends, and compares them with those of every shard running there.

Publishing before looking makes the check atomic without a lock between the shards: of
two shards starting at once, the later to publish sees the earlier's file (both may see
each other, and both are refused when they differ). A file is locked before it gets its
name, so a file that no process locks is a killed shard's: the next shard removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import inside_claim
from basis_bench.guards.outputs import json_text
from basis_bench.rollouts import fingerprint

SHARD_PREFIX, SHARD_SUFFIX = ".oracle-shard.", ".json"


def run_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The settings two run identities differ in (the model by its weights where both
    record them: :func:`~basis_bench.rollouts.fingerprint.model_difference`)."""
    differs = [k for k in (set(old) | set(new)) - {"model"} if old.get(k) != new.get(k)]
    model = fingerprint.model_difference(old.get("model"), new.get("model"))
    return sorted(differs + ([model] if model else []))


@contextlib.contextmanager
def running_shard(out: Path, identity: Mapping[str, Any], shard: str) -> Iterator[None]:
    """Run the block as shard ``shard`` of the run ``identity`` in the dataset ``out``
    (claimed): refused in one line where a shard running there samples the same policy
    with other settings."""
    fd, mine = _publish(out, {"shard": shard, "run": dict(identity)})
    try:
        for path in sorted(out.glob(f"{SHARD_PREFIX}*{SHARD_SUFFIX}")):
            other = _running(path) if path != mine else None
            if other is None or other["run"].get("policy") != identity["policy"]:
                continue
            differs = run_differences(other["run"], identity)
            if differs:
                raise InputError(
                    f"oracle shard {other['shard']} is writing policy {identity['policy']!r} "
                    f"into {out} with different settings ({', '.join(differs)}); start every "
                    "shard of a run with the same settings, or use another --out or --policy"
                )
        yield
    finally:
        mine.unlink(missing_ok=True)
        os.close(fd)  # the lock goes with it


def _publish(out: Path, record: Mapping[str, Any]) -> tuple[int, Path]:
    """A new shard file holding ``record``, locked before it is renamed to its name."""
    fd, name = tempfile.mkstemp(prefix=SHARD_PREFIX, suffix=".tmp", dir=out)
    tmp = Path(name)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        os.write(fd, json_text(record, sort_keys=True).encode())
        path = inside_claim(tmp.with_suffix(SHARD_SUFFIX))
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        os.close(fd)
        raise
    return fd, path


def _running(path: Path) -> dict[str, Any] | None:
    """The record of the shard file ``path`` while its shard runs; None once it has ended
    (the file is gone, or no process locks it: a killed shard's, removed here)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # its shard holds it: running
            text = os.read(fd, 1 << 20).decode("utf-8", errors="replace")
        else:
            path.unlink(missing_ok=True)
            return None
    finally:
        os.close(fd)
    try:
        record = bounded_json.loads(text)
    except json.JSONDecodeError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("run"), dict):
        raise InputError(f"{path} is not an oracle shard's record; remove it")
    return record
