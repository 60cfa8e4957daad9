"""The trajectory replay of an evaluate run: its :class:`Schedule`, read from the data once
before any replay (:func:`trajectory_schedule`), the replay on it (:func:`replay_schedule`:
:mod:`~basis_bench.evaluation.trajectory`'s epochs or
:mod:`~basis_bench.evaluation.step_replay`'s steps), the gradient benchmark on the step
schedule (:func:`gradient_table`) and what run.json says of it (:func:`schedule_record`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import Estimator
from basis_bench.evaluation.config import DEFAULT_BATCH, EvaluateConfig, given, named
from basis_bench.evaluation.dataset import Dataset
from basis_bench.evaluation.gradient import REFERENCE_ARM, GradientProbe, load_sketches
from basis_bench.evaluation.replay_plan import ReplayPlan, shared_prompts
from basis_bench.evaluation.step_replay import StepSchedule, check_step_sizes, replay_steps
from basis_bench.evaluation.trajectory import EpochSchedule, check_epoch_sizes, replay_trajectory
from basis_bench.guards.work_limit import check_draws
from basis_bench.rollouts.store import load_prompts
from basis_bench.rollouts.training_record import TRAINING_FILE, checkpoint_steps, training_record

TRAJECTORY_REPEATS = 200  # streams of the trajectory replay (whole epochs each); tight CIs


@dataclass(frozen=True)
class Schedule:
    """The trajectory replay's schedule (``auto`` resolved), each checkpoint's training
    step in the dataset's checkpoint order (empty for the epoch schedule), and the prompts a
    step it visits per visit when that is not ``batch_size`` (None)."""

    kind: str
    steps: list[int]
    batch: int | None = None


def _replay_plan(cfg: EvaluateConfig, options: Mapping[str, Any]) -> ReplayPlan:
    """What the trajectory replay runs, from the run's settings (at most TRAJECTORY_REPEATS
    streams)."""
    return ReplayPlan(
        min(cfg.repeats, TRAJECTORY_REPEATS), cfg.group_size, cfg.cache_n, cfg.seed,
        cfg.grid_size, options=options, features=cfg.features,
    )  # fmt: skip


def _epochs(cfg: EvaluateConfig, batch: int) -> EpochSchedule:
    """The epoch schedule's settings of a run, once :meth:`EvaluateConfig.fit` has set its oracle."""
    return EpochSchedule(batch, cfg.trajectory_epochs, cfg.oracle, cfg.trajectory_blend)


def _steps(cfg: EvaluateConfig, batch: int) -> StepSchedule:
    """The step schedule's settings of a run."""
    return StepSchedule(batch, cfg.rollouts_per_step, cfg.folds, cfg.standing_steps)


def replay_schedule(
    cfg: EvaluateConfig,
    ds: Dataset,
    schedule: Schedule,
    estimators: list[Estimator],
    options: Mapping[str, Any],
    progress: Callable[[str, int, int], None] | None,
) -> pl.DataFrame:
    """Every estimator over the checkpoints in order."""
    names = [e.name for e in estimators]
    plan, batch = _replay_plan(cfg, options), schedule.batch or cfg.batch
    prompts = load_prompts(ds.root)
    steps = schedule.steps
    if schedule.kind == "steps":
        order = sorted(range(len(steps)), key=steps.__getitem__)

        def tick_run(run: str, steps_done: int) -> None:
            if progress is not None:
                progress(f"trajectory, {run}", steps_done, steps_done)

        table, _ = replay_steps(
            ds.rewards, ds.reference, [ds.checkpoints[i] for i in order],
            [steps[i] for i in order], names, plan, _steps(cfg, batch), tick_run, prompts,
        )  # fmt: skip
        return table

    def tick(checkpoint: str, epoch: int) -> None:
        if progress is not None:
            progress(f"trajectory {checkpoint}", epoch, cfg.trajectory_epochs)

    table, _ = replay_trajectory(
        ds.rewards, ds.reference, ds.checkpoints, names, plan, _epochs(cfg, batch), tick, prompts
    )
    return table.with_columns(pl.lit("epochs").alias("schedule"))


def gradient_table(
    cfg: EvaluateConfig,
    ds: Dataset,
    schedule: Schedule,
    estimators: list[Estimator],
    options: Mapping[str, Any],
    progress: Callable[[str, int, int], None] | None,
) -> pl.DataFrame:
    """The gradient benchmark (:mod:`~basis_bench.evaluation.gradient`): one step replay per
    budget R of ``gradient_budgets``, every estimator (and RLOO, the reference arm) with its
    step gradients gathered at the checkpoints' own steps."""
    order = sorted(range(len(schedule.steps)), key=schedule.steps.__getitem__)
    checkpoints = [ds.checkpoints[i] for i in order]
    ids, _ = shared_prompts(ds.rewards, ds.reference, checkpoints)
    sketches = load_sketches(ds.root, checkpoints, list(ids))
    names = [e.name for e in estimators]
    names += [REFERENCE_ARM] if REFERENCE_ARM not in names else []
    prompts = load_prompts(ds.root)
    plan, base = _replay_plan(cfg, options), _steps(cfg, schedule.batch or cfg.batch)
    frames = []
    for r in cfg.budgets:
        probe = GradientProbe([sketches[c] for c in checkpoints], plan.repeats)
        replay_steps(
            ds.rewards, ds.reference, checkpoints, [schedule.steps[i] for i in order], names,
            plan, replace(base, rollouts_per_step=r), None, prompts, probe,
        )  # fmt: skip
        frames.append(probe.table)
        if progress is not None:
            progress(f"gradient, {r} rollouts a step", 1, 1)
    return pl.concat(frames)


def _shared_count(ds: Dataset) -> int:
    """How many prompts the reference and every checkpoint share (0 is refused later, by the
    check that names the checkpoint without any)."""
    held = [set(ds.rewards[p].prompt_ids.tolist()) for p in (ds.reference, *ds.checkpoints)]
    return len(set.intersection(*held))


def trajectory_schedule(
    cfg: EvaluateConfig, ds: Dataset, estimators: Sequence[Estimator] = ()
) -> Schedule:
    """The trajectory replay's :class:`Schedule`, read once per run (before any replay);
    options the schedule would not use are refused. The step schedule without
    ``batch_size`` visits prompts at the training run's own rate when the record has it:
    B = prompts_per_step / train_prompts x P of the P prompts replayed (16 of the dense
    trajectory's 48, 12 of the default data's 96), what "replays as the training did" means
    per visit."""
    record = training_record(ds.root)
    steps = checkpoint_steps(record, ds.checkpoints)
    schedule = cfg.trajectory_schedule
    if schedule == "auto":  # epochs when asked for by its options (the commands of before)
        moves = steps is not None and (len(set(steps)) > 1 or cfg.standing_steps > 0)
        schedule = "steps" if moves and not cfg.epoch_options_set() else "epochs"
    if schedule == "steps" and steps is None:
        raise InputError(
            f"{given('trajectory_schedule', 'steps')} needs every checkpoint's training step; {ds.root} has "
            f"no {TRAINING_FILE} giving one to each of {', '.join(ds.checkpoints)} (write it: "
            '{"steps": {"<checkpoint>": <step>, ...}}, or record it with oracle/import --step)'
        )
    cfg.check_schedule(schedule)
    if schedule != "steps" or steps is None:
        p = _shared_count(ds)
        epochs = EpochSchedule(cfg.batch_size or DEFAULT_BATCH, cfg.trajectory_epochs)
        repeats = min(cfg.repeats, TRAJECTORY_REPEATS)
        check_epoch_sizes(epochs, repeats, len(ds.checkpoints), max(len(estimators), 1), p)
        check_draws(  # an epoch: every prompt once (B at a time) for each estimator, G each
            "this trajectory replay", named("trajectory_epochs"), epochs.epochs_per_checkpoint,
            len(ds.checkpoints) * p * max(cfg.group_size, 1) * max(len(estimators), 1) * repeats,
        )  # fmt: skip
        return Schedule(schedule, [])
    rate = record.visit_rate() if record is not None else None
    p = _shared_count(ds)
    if cfg.batch_size is not None or rate is None or record is None:
        chosen = Schedule(schedule, steps)
        batch_from = None
    else:
        chosen = Schedule(schedule, steps, max(2, round(rate * p)))
        batch_from = (
            f"prompts_per_step of {Path(ds.root) / TRAINING_FILE}",
            record.prompts_per_step or 0,
            p / (record.train_prompts or 1),
            f", or give {named('batch_size')}",
        )
    plan = ReplayPlan(min(cfg.repeats, TRAJECTORY_REPEATS), cfg.group_size)
    check_step_sizes(
        steps, plan, _steps(cfg, chosen.batch or cfg.batch_size or DEFAULT_BATCH), estimators,
        p, f"the steps spanned by {Path(ds.root) / TRAINING_FILE}", batch_from,
    )  # fmt: skip
    return chosen


def schedule_record(cfg: EvaluateConfig, ds: Dataset, schedule: Schedule) -> dict[str, Any]:
    """What run.json says of the trajectory's schedule."""
    if schedule.kind == "epochs":
        return {
            "schedule": schedule.kind,
            "epochs_per_checkpoint": cfg.trajectory_epochs,
            "blend": cfg.trajectory_blend,
        }
    at = dict(zip(ds.checkpoints, schedule.steps, strict=True))
    return {
        "schedule": schedule.kind, "steps": at, "checkpoint_order": sorted(at, key=at.__getitem__),
        "rollouts_per_step": cfg.rollouts_per_step, "batch_size": schedule.batch or cfg.batch,
        "folds": cfg.folds, "standing_steps": cfg.standing_steps,
    }  # fmt: skip
