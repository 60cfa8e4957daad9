"""What fits in this machine's memory, asked before allocating: a size the user gave (a
count of 10^12 samples, a simulation of 10^9 prompts) is one line, not a numpy
``MemoryError`` traceback or the kernel's out-of-memory kill after minutes."""

from __future__ import annotations

from basis_bench.errors import InputError

# Peak bytes of one rollout row while it is built and written (index arrays, sort keys, the
# frame, the Parquet writer): the slope of peak resident memory (VmHWM of a fresh process)
# between runs of 2M, 4M, 8M and 16M rows, benchmarks/bench_rollout_memory.py, Dec 2026:
# `import counts` 242, 213 and 247 B a row (one 2M->4M pair of an earlier run 289; from
# 1M to 16M rows 238 B), `simulate` 149, 147 and 148 B a row. 256 covers the import's slope
# at every size but that one pair; the simulation needs less, so its check is conservative.
BYTES_PER_ROLLOUT = 256


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


def check_rollouts_fit(rows: int, what: str, advice: str) -> None:
    """Refuse building ``rows`` rollout rows at once when they cannot fit in free memory."""
    need, free = rows * BYTES_PER_ROLLOUT, available_memory()
    if free is not None and need > free:
        raise InputError(
            f"{what} makes {rows:,} rollouts at once, about {need / 2**30:,.1f} GiB; only "
            f"{free / 2**30:,.1f} GiB of memory is free; {advice}"
        )
