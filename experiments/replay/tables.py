"""The trajectory tables of docs/results.md under the step replay (issue 31): budget-matched,
per visit at the training run's own visit rate, and by visits per checkpoint interval.

    python experiments/replay/tables.py [DATASET] [--estimators a,b,...] [--repeats R]
        [--budget 64] [--visits 1,2,4,8] [--standing N]

DATASET: a dataset folder (default: the shipped default data). Its training.json gives each
checkpoint's step and the run's visit rate (prompts_per_step / train_prompts); a dataset
with one checkpoint is replayed as a standing policy (--standing steps, default: 8 visits of
every prompt at the per-visit batch). Prints markdown tables of the noise-corrected MSE per
checkpoint interval and over the whole trajectory, and the share of 0/1 baselines.
"""

from __future__ import annotations

import argparse
import itertools
import math

import polars as pl

from basis_bench.evaluation.dataset import DEFAULT_DATASET, open_dataset
from basis_bench.evaluation.replay_plan import ReplayPlan
from basis_bench.evaluation.step_replay import StepSchedule, replay_steps
from basis_bench.rollouts.store import load_prompts
from basis_bench.rollouts.training_record import checkpoint_steps, training_record

ESTIMATORS = "grpo,rloo,reinforce_pp,offline,basis,basis_memory,basis_context,spo_tracker"


def table(result: pl.DataFrame, title: str) -> str:
    """Markdown: one row per estimator, a column per checkpoint interval and the whole."""
    rows = result.filter(pl.col("scope") == "checkpoint")
    names = rows["checkpoint"].unique(maintain_order=True).to_list()
    heads = [f"{a} -> {b}" for a, b in itertools.pairwise(names)] + names[-1:]
    whole = result.filter(pl.col("scope") == "trajectory")
    out = [
        f"**{title}**",
        "",
        "| estimator | prompts/step | rollouts | " + " | ".join(heads) + " | whole | 0/1 |",
        "| --- " * (len(heads) + 5) + "|",
    ]
    for w in whole.iter_rows(named=True):
        by = rows.filter(pl.col("estimator") == w["estimator"])
        cells = [f"{x:.4f}" for x in by["mse_noise_corrected"]]
        name = w["estimator"] + (
            f"({w['rollouts_per_prompt']})" if w["rollouts_per_prompt"] > 1 else ""
        )
        out.append(
            f"| {name} | {w['prompts_per_step']} | {w['rollouts_spent']:,} | "
            + " | ".join(cells)
            + f" | {w['mse_noise_corrected']:.4f} | {100 * w['extreme_rate']:.0f}% |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dataset", nargs="?", default=str(DEFAULT_DATASET))
    parser.add_argument("--estimators", default=ESTIMATORS)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--budget", type=int, default=64)
    parser.add_argument("--visits", default="1,2,4,8")
    parser.add_argument("--ref-n", type=int, default=64)
    parser.add_argument(
        "--batch-size", type=int, default=None, help="per visit (default: training's rate)"
    )
    args = parser.parse_args()
    ds = open_dataset(args.dataset)
    names = args.estimators.split(",")
    record = training_record(ds.root)
    steps = checkpoint_steps(record, ds.checkpoints)
    p = len(set.intersection(*(set(ds.rewards[c].prompt_ids) for c in ds.checkpoints)))
    if steps is None or len(steps) == 1:  # a standing policy: visits per standing step
        steps, span = [0], None
    else:
        order = sorted(range(len(steps)), key=steps.__getitem__)
        steps = [steps[i] for i in order]
        span = steps[-1] - steps[0]
    checkpoints = ds.checkpoints if span is None else [ds.checkpoints[i] for i in order]
    rate = record.visit_rate() if record is not None else None
    per_visit = args.batch_size or max(2, round((rate or 16 / p) * p))
    prompts = load_prompts(ds.root)

    def run(title: str, batch: int, budget: int | None, standing: int = 0) -> None:
        plan = ReplayPlan(repeats=args.repeats, ref_n=args.ref_n)
        s = StepSchedule(batch_size=batch, rollouts_per_step=budget, standing_steps=standing)
        result, _ = replay_steps(
            ds.rewards, ds.reference, checkpoints, steps, names, plan, s, prompts=prompts
        )
        print(table(result, title), flush=True)

    standing = 0 if span is not None else math.ceil(8 * p / per_visit) - 1
    run(f"budget-matched, {args.budget} rollouts a step", per_visit, args.budget, standing)
    run(
        f"per visit, {per_visit} prompts a step (the training run's visit rate)",
        per_visit,
        None,
        standing,
    )
    for v in (int(x) for x in args.visits.split(",")):
        if span is None:  # standing: v visits of every prompt at the per-visit batch
            run(
                f"per visit, {v} visit(s) of each prompt",
                per_visit,
                None,
                math.ceil(v * p / per_visit) - 1,
            )
            continue
        batch = round(v * p * (len(steps) - 1) / span)  # above p: several batches a step
        if batch < 2:
            print(f"(skipped: {v} visits per checkpoint interval need {batch} prompts a step)\n")
            continue
        got = batch * span / (p * (len(steps) - 1))
        run(
            f"per visit, {batch} prompts a step: {got:.2f} visits of each prompt per checkpoint interval",
            batch,
            None,
        )


if __name__ == "__main__":
    main()
