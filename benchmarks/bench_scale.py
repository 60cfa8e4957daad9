"""Peak memory and wall time of the default `basis-bench evaluate` at the paper's scale.

The paper's training set is DAPO-Math-17K (17,398 prompts) and its value study samples 256
oracle rollouts per prompt per checkpoint. This builds simulated sets of that shape (64
reference samples, 3 checkpoints x 272 samples: 256 oracle + 16 pool) with `simulate`, and
runs the default evaluate (every estimator, the trajectory replay, estimates.parquet) on
each, every run a fresh child process whose own peak resident memory (VmHWM) is
printed, with its wall and CPU time (on a shared machine, CPU time is the one to compare)
and the memory evaluate's pre-flight check predicted
(:func:`basis_bench.evaluation.cost.evaluate_memory`); then `figures` on that run's results, in
a fresh process of its own, and its peak (it reads only the binned tables, so it should not
grow with the prompts). Default: 2,500 / 10,000 / 17,398 prompts
at 1,000 repeats, and 2,500 prompts at 10,000 repeats (the table in docs/scale.md).

    python benchmarks/bench_scale.py [--prompts 2500 10000 17398] [--repeats 1000]
        [--more-repeats 10000] [--no-trajectory]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM, which exec resets. ru_maxrss does not on
    Linux (it keeps the forking parent's peak, here the one that simulated the data)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(data: str, repeats: int, out: str, trajectory: bool) -> dict[str, float]:
    """One evaluate run in this process; returns its measurements."""
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.cost import evaluate_memory, held_bytes
    from basis_bench.evaluation.dataset import checkpoint_data, open_dataset, smallest_checkpoint
    from basis_bench.evaluation.run import TRAJECTORY_REPEATS, evaluate

    t0, cpu0 = time.perf_counter(), time.process_time()
    cfg = EvaluateConfig(rollouts=data, repeats=repeats, trajectory=trajectory)
    evaluate(cfg, out)
    wall, cpu, peak = time.perf_counter() - t0, time.process_time() - cpu0, peak_rss_mb()
    ds = open_dataset(data)  # after the run: what evaluate's check predicted
    # the defaults evaluate took from the data (as evaluation/run.py fits them)
    cfg = cfg.fit(*smallest_checkpoint(ds), ds.rewards[ds.reference].matrix.shape[1])
    datas = [
        checkpoint_data(ds, c, cfg.oracle, cfg.cache_n, cfg.group_size) for c in ds.checkpoints
    ]
    streams = min(repeats, TRAJECTORY_REPEATS) if trajectory else 0
    predicted = evaluate_memory(
        max(d.n_prompts for d in datas), held_bytes(ds.rewards, datas), streams
    )
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "max_rss_mb": peak,
        "predicted_mb": predicted / 2**20,
        "estimates_mb": (Path(out) / "estimates.parquet").stat().st_size / 2**20,
    }


def figures_child(results: str, out: str) -> dict[str, float]:
    """`figures` on one evaluate's results in this process; returns its peak memory."""
    from basis_bench.evaluation.figures import make_figures

    make_figures(results, out)
    return {"max_rss_mb": peak_rss_mb()}


def run_child(*args: str) -> dict[str, float]:
    """This script in a fresh process with `args`; returns the JSON it printed last."""
    cmd = [sys.executable, __file__, *args]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, nargs="+", default=[2500, 10000, 17398])
    parser.add_argument("--repeats", type=int, default=1000)
    parser.add_argument("--more-repeats", type=int, nargs="*", default=[10000])
    parser.add_argument("--no-trajectory", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--figures-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        data, repeats, out, trajectory = args.child
        print(json.dumps(child(data, int(repeats), out, trajectory == "1")))
        return
    if args.figures_child:
        print(json.dumps(figures_child(*args.figures_child)))
        return

    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    runs = [(p, args.repeats) for p in args.prompts]
    runs += [(min(args.prompts), r) for r in args.more_repeats]
    trajectory = "0" if args.no_trajectory else "1"
    print(
        "evaluate (default: all estimators, trajectory "
        f"{'off' if args.no_trajectory else 'on'}), simulated 64 reference + 3 x 272 samples per prompt"
    )
    print(f"{'prompts':>8} {'repeats':>8} {'rollouts':>11} {'wall s':>8} {'CPU s':>8} "
          f"{'peak RSS MB':>12} {'predicted MB':>13} {'estimates MB':>13} {'figures MB':>11}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        sets: dict[int, Path] = {}
        for prompts, repeats in runs:
            if prompts not in sets:
                cfg = SimulationConfig(n_prompts=prompts, ref_n=64, checkpoint_n=272)
                sets[prompts] = simulate(cfg, Path(tmp) / f"data{prompts}")
            out = Path(tmp) / f"out{prompts}-{repeats}"
            r = run_child("--child", str(sets[prompts]), str(repeats), str(out), trajectory)
            # beside the results, not in them (figures refuses a folder inside a results one)
            figures = run_child(
                "--figures-child", str(out), str(out.with_name(out.name + "-figures"))
            )
            print(
                f"{prompts:>8} {repeats:>8} {prompts * (64 + 3 * 272):>11} {r['wall_s']:>8.0f} "
                f"{r['cpu_s']:>8.0f} "
                f"{r['max_rss_mb']:>12.0f} {r['predicted_mb']:>13.0f} {r['estimates_mb']:>13.0f} "
                f"{figures['max_rss_mb']:>11.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
