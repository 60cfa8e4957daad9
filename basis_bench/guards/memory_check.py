"""What fits in this machine's memory, checked before allocating: a size the user gave (a
count of 10^12 samples, a simulation of 10^9 prompts) is one line, not a numpy
``MemoryError`` traceback or the kernel's out-of-memory kill after minutes."""

from __future__ import annotations

import math
import resource
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from basis_bench.errors import InputError

# Peak bytes of one rollout row while it is built and written (index arrays, sort keys, the
# frame, the Parquet writer): the slope of peak resident memory (VmHWM of a fresh process)
# between runs of 2M, 4M, 8M and 16M rows, benchmarks/bench_rollout_memory.py, Dec 2026.
# An import holds ids as Categorical codes, writes a row group at a time and leaves rows
# already in order unsorted: `import counts` 28, 34 and 33 B a row (150-323 before);
# `import long`, which needs no check (its rows are in the file), 67-86 of a CSV and 45-61
# of Parquet. The import's check doubles counts' slope: acc-history writes several policies,
# each copied once more, and the ~300 MiB intercept is not counted. `simulate` 134, 148 and
# 148 B a row: its check is that rounded up.
IMPORT_BYTES_PER_ROLLOUT = 64
# A row read whole from Parquet, beyond its decoded bytes: polars' offsets and validity, the
# cast, filter, concatenation and sort copies of the store's full reader; the import's 64.
READ_BYTES_PER_ROW = IMPORT_BYTES_PER_ROLLOUT
SIMULATE_BYTES_PER_ROLLOUT = 160
# What one sampled rollout holds while it is generated, graded and stored: per new token
# its id (int64) kept with its text, and besides the text's object, the reward row and the
# Parquet row; loose from above. A part of the oracle (a chunk of prompts x --n) and a
# training step's rollouts are held at once.
SAMPLED_ROLLOUT_BYTES = 512
SAMPLED_TOKEN_BYTES = 16


def sampled_rollout_bytes(max_new_tokens: int) -> int:
    """Peak bytes of one sampled rollout of at most ``max_new_tokens`` tokens."""
    return SAMPLED_ROLLOUT_BYTES + SAMPLED_TOKEN_BYTES * max_new_tokens


CGROUP_ROOT = Path("/sys/fs/cgroup")
# A cgroup's memory files: limit, usage, and the memory.stat key of reclaimable page cache
# (counted in usage, given back under pressure), for cgroup v2 and v1.
_V2 = ("memory.max", "memory.current", "inactive_file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable of /proc/meminfo, or less where
    its cgroup (as SLURM, Docker or Kubernetes set) allows less: the limit minus the usage
    (less reclaimable page cache) of its cgroup and of every cgroup above it. A 1.5 GB
    cgroup on a host with 100 GB free passed the check and was killed without a word. None
    where the system says nothing."""
    rooms = (_meminfo_available(), *_cgroup_rooms(), *_rlimit_rooms())
    found = [room for room in rooms if room is not None]
    return min(found) if found else None


# A process's own limits (``ulimit -v``: RLIMIT_AS, ``ulimit -d``: RLIMIT_DATA) and the
# /proc/self/status line of what they count. Under ``ulimit -v 4000000`` MemAvailable said
# 20 GB and numpy's 7.45 GiB array was a MemoryError traceback: the limit is free memory too.
_RLIMITS = (("RLIMIT_AS", "VmSize:"), ("RLIMIT_DATA", "VmData:"))


def _rlimit_rooms() -> list[int]:
    """Each soft resource limit on this process's memory minus what it already counts."""
    rooms = []
    for name, line in _RLIMITS:
        try:
            soft, _ = resource.getrlimit(getattr(resource, name))
        except (AttributeError, OSError, ValueError):
            continue
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        used = _status_bytes(line)
        rooms.append(max(soft - (used or 0), 0))
    return rooms


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_rooms() -> list[int]:
    """Limit minus usage of each memory cgroup this process is in or under (v2 and v1)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    rooms = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":
            v2 = CGROUP_ROOT if (CGROUP_ROOT / "cgroup.controllers").exists() else None
            base, files = v2 or CGROUP_ROOT / "unified", _V2
        elif "memory" in controllers.split(","):
            base, files = CGROUP_ROOT / "memory", _V1
        else:
            continue
        folder = base / path.strip().lstrip("/")
        for above in (folder, *(p for p in folder.parents if base in p.parents or p == base)):
            room = _cgroup_room(above, *files)
            if room is not None:
                rooms.append(room)
    return rooms


def _cgroup_room(folder: Path, limit: str, usage: str, cache: str) -> int | None:
    """One cgroup's limit minus its usage, None without a limit."""
    try:
        cap = int((folder / limit).read_text().split()[0])  # "max": no limit (ValueError)
        used = int((folder / usage).read_text().split()[0])
        stat = dict(line.split()[:2] for line in (folder / "memory.stat").read_text().splitlines())
    except (OSError, ValueError, IndexError):
        return None
    return max(cap - used + int(stat.get(cache, 0)), 0)


def check_rollouts_fit(rows: int, bytes_per_row: int, what: str, advice: str) -> None:
    """Refuse building ``rows`` rollout rows at once, ``bytes_per_row`` each at the peak,
    when they cannot fit in free memory."""
    need, free = rows * bytes_per_row, available_memory()
    if free is not None and need > free:
        raise InputError(
            f"{what} makes {rows:,} rollouts at once, about {_gib(need)} GiB; only "
            f"{_gib(free)} GiB of memory is free (to this process's cgroup); {advice}"
        )


@dataclass(frozen=True)
class Size:
    """One allocation-sized number of a command: its ``value``, how the user gave it
    (``name``: a flag, an API argument, a field of a file, as the refusal names it) and the
    bytes each unit of it costs, the other sizes held (a float: a fraction of a byte a unit
    is fine)."""

    name: str
    value: int
    bytes_each: float
    advice: str = ""  # another way out, said after the value that fits


# Beyond any machine's memory: a larger value is counted as this many units (10**400 times
# a float overflowed), so the budget's arithmetic never raises.
_HUGE = 2**80


def _gib(n: float) -> str:
    return f"{min(n, _HUGE) / 2**30:,.1f}"


def _shown(value: int) -> str:
    text = f"{value:,}"
    return text if len(text) <= 40 else f"about 10^{len(str(value)) - 1}"


def _bytes(size: Size) -> int:
    return math.ceil(min(max(size.value, 0), _HUGE) * size.bytes_each)


def size_budget(sizes: Sequence[Size], base: int = 0) -> int:
    """Bytes that ``sizes`` (and ``base``) make: Python's integers, so a value of 10**30
    is counted, never wrapped or overflowed."""
    return base + sum(_bytes(s) for s in sizes)


def check_sizes(what: str, sizes: Sequence[Size], base: int = 0) -> int:
    """The one size budget: refuse, before anything is allocated, a work whose sizes make
    more than this process may allocate (:func:`available_memory`: free memory, its
    cgroups' and its ``ulimit``'s room), naming the size that costs most and the value of it
    that fits. Every allocation-sized number a user or a file gives (a flag, a field of a
    dataset's training.json, a training setting) passes here; returns the bytes needed."""
    need, free = size_budget(sizes, base), available_memory()
    if free is None or need <= free:
        return need
    worst = max(sizes, key=_bytes)
    rest = need - _bytes(worst)
    fits = int((free - rest) // worst.bytes_each) if worst.bytes_each > 0 else 0
    if fits >= 1:
        fix = f"{worst.name} at most {fits:,} fits{worst.advice}"
    else:
        fix = f"lower {', '.join(s.name for s in sizes)} or free memory"
    raise InputError(  # the bytes a unit costs are estimates, loose from above: it says so
        f"{what} needs about {_gib(need)} GiB by the budget's estimate ({worst.name} "
        f"{_shown(worst.value)}); only {_gib(free)} GiB of memory is free to this process; {fix}"
    )
