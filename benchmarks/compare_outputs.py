"""Every CSV of two `basis-bench evaluate` output folders: byte for byte, or the largest
relative difference of their numbers (text columns must match exactly).

    python benchmarks/compare_outputs.py BEFORE_DIR AFTER_DIR [--rtol 1e-9]

Exits 1 when a CSV is missing from AFTER_DIR, differs in shape or text, or differs in a
number by more than ``--rtol`` relative: the check behind "every CSV equal to 1e-9".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import polars as pl


def largest_difference(before: pl.DataFrame, after: pl.DataFrame) -> float:
    """The largest relative difference of two tables' numbers (NaN against NaN: equal)."""
    if before.columns != after.columns or before.height != after.height:
        return float("inf")
    worst = 0.0
    for name in before.columns:
        if not before[name].dtype.is_numeric():
            if not before[name].equals(after[name]):
                return float("inf")
            continue
        a, b = (t[name].to_numpy().astype(np.float64) for t in (before, after))
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        if not same.all():
            rel = np.abs(a - b) / np.maximum(np.abs(a), np.finfo(np.float64).tiny)
            worst = max(worst, float(np.max(np.where(same, 0.0, rel))))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-9)
    args = parser.parse_args()
    failed = False
    for path in sorted(args.before.glob("*.csv")):
        other = args.after / path.name
        if not other.exists():
            print(f"{path.name}: missing from {args.after}")
            failed = True
        elif path.read_bytes() == other.read_bytes():
            print(f"{path.name}: byte for byte")
        else:
            worst = largest_difference(pl.read_csv(path), pl.read_csv(other))
            failed |= worst > args.rtol
            print(f"{path.name}: largest relative difference {worst:.2e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
