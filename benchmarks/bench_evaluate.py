"""Throughput and memory of `basis-bench evaluate` with every registered estimator.

A simulated dataset of 2000 prompts (64 reference samples, one checkpoint with 256 oracle +
64 pool samples each), B = 64, G = 8, all estimators, estimates.parquet written. Each run is
a fresh child process, so its peak resident memory (ru_maxrss) is its own. Printed per run:
wall time, batch repeats per second of the replay (after loading), the tracemalloc peak of
Python/numpy allocations, the process's peak RSS, and the size of estimates.parquet. The
10,000-repeat run must not need more memory than the 1,000-repeat run (estimates stream in
chunks of 256 repeats).

    python benchmarks/bench_evaluate.py [--prompts 2000] [--repeats 1000 10000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path


def child(data: str, repeats: int, out: str, trace: bool) -> dict[str, float]:
    """One evaluate run in this process; returns its measurements."""
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.dataset import open_dataset
    from basis_bench.evaluation.run import evaluate

    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    open_dataset(data)  # the load on its own, to separate it from the replay
    t1 = time.perf_counter()
    evaluate(EvaluateConfig(rollouts=data, repeats=repeats, batch_size=64, group_size=8), out)
    t2 = time.perf_counter()
    peak = tracemalloc.get_traced_memory()[1] if trace else float("nan")
    return {
        "repeats": repeats,
        "load_s": t1 - t0,
        "evaluate_s": t2 - t1,
        "repeats_per_s": repeats / max(t2 - t1 - (t1 - t0), 1e-9),
        "tracemalloc_peak_mb": peak / 2**20,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "estimates_mb": (Path(out) / "estimates.parquet").stat().st_size / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--repeats", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument(
        "--child", nargs=4, metavar=("DATA", "REPEATS", "OUT", "TRACE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        data, repeats, out, trace = args.child
        print(json.dumps(child(data, int(repeats), out, trace == "1")))
        return

    from basis_bench.estimators import ESTIMATORS
    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    with tempfile.TemporaryDirectory() as tmp:
        data = simulate(
            SimulationConfig(
                n_prompts=args.prompts, ref_n=64, checkpoint_n=320, stages={"late": 1.5}
            ),
            Path(tmp) / "data",
        )
        print(
            f"evaluate: {args.prompts} simulated prompts, 1 checkpoint, B = 64, G = 8, {len(ESTIMATORS)} estimators"
        )
        print(f"{'repeats':>8} {'tracing':>8} {'load s':>7} {'total s':>8} {'repeats/s':>10} "
              f"{'tracemalloc MB':>15} {'peak RSS MB':>12} {'estimates MB':>13}")  # fmt: skip
        for repeats in args.repeats:
            for trace in ("0", "1"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    str(data),
                    str(repeats),
                    str(Path(tmp) / f"out{repeats}{trace}"),
                    trace,
                ]
                r = json.loads(
                    subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                )
                print(
                    f"{r['repeats']:>8} {'on' if trace == '1' else 'off':>8} {r['load_s']:>7.2f} {r['evaluate_s']:>8.2f} "
                    f"{r['repeats_per_s']:>10.0f} {r['tracemalloc_peak_mb']:>15.1f} {r['max_rss_mb']:>12.0f} "
                    f"{r['estimates_mb']:>13.1f}"
                )
        print("repeats/s: untraced rows are the speed; traced rows give the allocation peak.")


if __name__ == "__main__":
    main()
