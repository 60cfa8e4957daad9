"""What fits in this machine's memory, checked before allocating: a size the user gave (a
count of 10^12 samples, a simulation of 10^9 prompts) is one line, not a numpy
``MemoryError`` traceback or the kernel's out-of-memory kill after minutes."""

from __future__ import annotations

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
SIMULATE_BYTES_PER_ROLLOUT = 160


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where the system does not say)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_rollouts_fit(rows: int, bytes_per_row: int, what: str, advice: str) -> None:
    """Refuse building ``rows`` rollout rows at once, ``bytes_per_row`` each at the peak,
    when they cannot fit in free memory."""
    need, free = rows * bytes_per_row, available_memory()
    if free is not None and need > free:
        raise InputError(
            f"{what} makes {rows:,} rollouts at once, about {need / 2**30:,.1f} GiB; only "
            f"{free / 2**30:,.1f} GiB of memory is free; {advice}"
        )
