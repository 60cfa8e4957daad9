"""What fits in this machine's memory, checked before allocating: a size the user gave (a
count of 10^12 samples, a simulation of 10^9 prompts) is one line, not a numpy
``MemoryError`` traceback or the kernel's out-of-memory kill after minutes."""

from __future__ import annotations

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
    found = [room for room in (_meminfo_available(), *_cgroup_rooms()) if room is not None]
    return min(found) if found else None


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
            f"{what} makes {rows:,} rollouts at once, about {need / 2**30:,.1f} GiB; only "
            f"{free / 2**30:,.1f} GiB of memory is free (to this process's cgroup); {advice}"
        )
