"""Peak memory per rollout row of the commands that build rollouts at once: the constants
``basis_bench.guards.memory_check.IMPORT_BYTES_PER_ROLLOUT`` and ``SIMULATE_BYTES_PER_ROLLOUT`` that their
pre-flight checks multiply by the rows.

Runs ``import counts`` (a counts CSV of 1,000 prompts expanded to the given rows), ``import
long`` of a long CSV and of a long Parquet file (17,398 prompts, the paper's, with the given
rows between them; rows in sample-major order, as a generation loop over rounds writes them,
so the import sorts them) and ``simulate`` (its largest policy of the given rows) at each
size, every run a fresh child process whose own peak resident memory (VmHWM) is printed;
the bytes per row are the slope between consecutive sizes (the interpreter and libraries
are the intercept).

    python benchmarks/bench_rollout_memory.py [--rows 1000000 2000000 4000000]
        [--commands 'import counts' 'import long csv' 'import long pq' simulate]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scale import peak_rss_mb

PROMPTS = 1000  # counts rows of the import
LONG_PROMPTS = 17_398  # prompts of the long sources (DAPO-Math-17K)
CHECKPOINT_N = 248  # simulate: samples per prompt of every policy (+2 in the check's count)


def child(argv: list[str]) -> dict[str, float]:
    """One ``basis-bench ARGV`` in this process; its peak resident memory."""
    from basis_bench.cli import main

    sys.argv = ["basis-bench", *argv]
    try:
        main()
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise
    return {"peak_mb": peak_rss_mb()}


def long_source(rows: int, path: Path) -> None:
    """A long table of about ``rows`` rows (whole samples per prompt), sample-major."""
    import numpy as np
    import polars as pl

    samples = rows // LONG_PROMPTS
    sample = np.repeat(np.arange(samples, dtype=np.int32), LONG_PROMPTS)
    prompt = np.tile(np.arange(LONG_PROMPTS), samples)
    reward = (np.random.default_rng(0).random(sample.size) < 0.4).astype(np.float64)
    ids = pl.Series(prompt).cast(pl.String).str.zfill(5)
    frame = pl.DataFrame({"prompt_id": "dapo_" + ids, "sample_idx": sample, "reward": reward})
    if path.suffix == ".csv":
        frame.write_csv(path)
    else:
        frame.write_parquet(path)


def commands(rows: int, tmp: Path) -> dict[str, list[str]]:
    """The command lines that build ``rows`` rollout rows at once."""
    source = tmp / f"counts{rows}.csv"
    n = rows // PROMPTS
    source.write_text(
        "prompt_id,n,n_correct\n" + "".join(f"p{i},{n},{n // 3}\n" for i in range(PROMPTS))
    )
    prompts = rows // (CHECKPOINT_N + 2)
    csv, parquet = tmp / f"long{rows}.csv", tmp / f"long{rows}.parquet"
    for path in (csv, parquet):
        if not path.exists():
            long_source(rows, path)
    return {
        "import counts": ["import", "counts", str(source), "--policy", "ck", "--out",
                          str(tmp / f"imported{rows}")],
        "import long csv": ["import", "long", str(csv), "--policy", "ck", "--out",
                            str(tmp / f"long-csv{rows}")],
        "import long pq": ["import", "long", str(parquet), "--policy", "ck", "--out",
                           str(tmp / f"long-pq{rows}")],
        "simulate": ["simulate", "--prompts", str(prompts), "--ref-n", "64",
                     "--checkpoint-n", str(CHECKPOINT_N), "--out", str(tmp / f"sim{rows}")],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 2_000_000, 4_000_000])
    parser.add_argument(
        "--commands", nargs="+", help="run only these commands (e.g. 'import long pq')"
    )
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    print(f"{'command':<16} {'rows':>10} {'peak RSS MB':>12} {'B/row (slope)':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        sizes = sorted(args.rows)
        for name in args.commands or commands(sizes[0], Path(tmp)):
            last: tuple[int, float] | None = None
            for rows in sizes:
                argv = commands(rows, Path(tmp))[name]
                cmd = [sys.executable, __file__, "--child", *argv]
                done = subprocess.run(cmd, check=True, capture_output=True, text=True)
                peak = json.loads(done.stdout.splitlines()[-1])["peak_mb"]
                slope = (peak - last[1]) * 2**20 / (rows - last[0]) if last else float("nan")
                print(f"{name:<16} {rows:>10,} {peak:>12.0f} {slope:>14.0f}", flush=True)
                last = (rows, peak)


if __name__ == "__main__":
    main()
