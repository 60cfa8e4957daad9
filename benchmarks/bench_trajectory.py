"""CPU time of the trajectory replay, per estimator, at the paper's shape.

A simulated set of the paper's shape (64 reference samples + 3 checkpoints x 272 samples,
256 oracle + 16 pool, per prompt; stages early 0.3, middle 0.8, late 1.5 in log-odds) with
2,000 prompts, or 17,398 (DAPO-Math-17K's) with ``--paper``. Each estimator's trajectory
replay runs as `basis-bench evaluate` runs it (200 streams, B = 64, G = 8, one epoch per
checkpoint) in a fresh child process, alone, and so do all of them together (``all``, the
default evaluate's replay). Printed per row: the replay's user and system CPU seconds
(getrusage around the replay: load and the one-step replay are not in it) and the child's
peak RSS (VmHWM, which the child's exec resets: ru_maxrss would keep the parent's, which
simulated the set). CPU, not wall, time: on a shared machine the wall clock measures the
neighbours.

    python benchmarks/bench_trajectory.py [--prompts 2000 | --paper] [--estimators a,b,all]

Issue 46's targets, at 2,000 prompts: basis_track at most 1.5 x basis_memory, and `all`
(the whole default evaluate, one-step replay included) at most 90 CPU-s.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_scale import peak_rss_mb

PAPER_PROMPTS = 17_398
STATEFUL = ("basis_track", "basis_memory", "basis_context")


def child(data: str, names: str) -> dict[str, float]:
    """One trajectory replay in this process; its CPU seconds and this process's peak RSS."""
    from basis_bench.estimators import available
    from basis_bench.evaluation.dataset import open_dataset
    from basis_bench.evaluation.replay_plan import ReplayPlan
    from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory
    from basis_bench.rollouts.store import load_prompts

    ds = open_dataset(data)
    estimators = list(available()) if names == "all" else names.split(",")
    plan, epochs = ReplayPlan(repeats=200, group_size=8), EpochSchedule(64, oracle_n=256)
    before = resource.getrusage(resource.RUSAGE_SELF)
    replay_trajectory(
        ds.rewards, ds.reference, ds.checkpoints, estimators, plan, epochs, None,
        load_prompts(ds.root),
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "user_s": after.ru_utime - before.ru_utime,
        "system_s": after.ru_stime - before.ru_stime,
        "max_rss_mb": peak_rss_mb(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--paper", action="store_true", help=f"{PAPER_PROMPTS:,} prompts")
    parser.add_argument("--estimators", default=",".join((*STATEFUL, "all")))
    parser.add_argument("--child", nargs=2, metavar=("DATA", "NAMES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return

    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    prompts = PAPER_PROMPTS if args.paper else args.prompts
    stages = {"early": 0.3, "middle": 0.8, "late": 1.5}
    with tempfile.TemporaryDirectory() as tmp:
        data = simulate(
            SimulationConfig(n_prompts=prompts, ref_n=64, checkpoint_n=272, stages=stages),
            Path(tmp) / "data",
        )
        print(f"trajectory replay: {prompts:,} simulated prompts, 3 checkpoints, 200 streams")
        print(f"{'estimators':>14} {'user s':>8} {'system s':>9} {'CPU s':>8} {'peak RSS MiB':>13}")
        for names in args.estimators.split(","):
            cmd = [sys.executable, __file__, "--child", str(data), names]
            r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            cpu = r["user_s"] + r["system_s"]
            print(
                f"{names:>14} {r['user_s']:>8.1f} {r['system_s']:>9.1f} {cpu:>8.1f} "
                f"{r['max_rss_mb']:>13.0f}"
            )


if __name__ == "__main__":
    main()
