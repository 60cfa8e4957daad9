"""Several seeds of one configuration, each in its own run ``RUN/seed-S``, resumable per run.

``basis-bench train --config FILE --seeds 0,1,2`` calls :func:`train_seeds`. Rerun the
same command after an interruption: each seed's run is

- **finished** (its log reached ``steps``): skipped;
- **interrupted** (it has a complete checkpoint): resumed from the latest one, with its
  optimizer, RNG and estimator state, so it continues as if never stopped;
- **new** (no run yet): started;
- **restart** (a log but no complete checkpoint: stopped before its first one): its partial
  log, rollouts, evaluations and partial checkpoints are deleted and it starts again, when
  its config.json holds this configuration (a partial run of other settings is refused).

A run written with other settings than the configuration's (a different ``lr``, say) is
refused rather than skipped or continued: only ``steps`` may differ, which extends a
finished run, and the observational settings (the value probe's), which change nothing of
training: a run continues, or is skipped, under other ones. ``keep_checkpoints`` > 0 deletes all but the newest that many checkpoints
while a run goes (a SmolLM2-135M checkpoint is 1.6 GB).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError
from basis_bench.guards.outputs import json_text
from basis_bench.train.checkpoint import PARTIAL, TRAINER_STATE, load_trainer_state
from basis_bench.train.config import TrainConfig, config_dict
from basis_bench.train.setup import CHECKPOINTS_DIR, LOG_FILE
from basis_bench.train.summary import SEED_PREFIX, setting_differences

Record = dict[str, Any]


def seed_config(config: TrainConfig, seed: int) -> TrainConfig:
    """``config`` for one seed: its run in ``run_dir/seed-S``."""
    return dataclasses.replace(
        config, seed=seed, run_dir=str(Path(config.run_dir) / f"{SEED_PREFIX}{seed}")
    )


def checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    found = (run_dir / CHECKPOINTS_DIR).glob("step-*")
    done = [p for p in found if not p.name.endswith(PARTIAL) and (p / TRAINER_STATE).is_file()]
    return sorted(done, key=lambda p: p.name)


def last_logged_step(run_dir: Path) -> int:
    """The last step of the run's log (-1 without one)."""
    from basis_bench.train.loop import read_log

    if not os.path.lexists(run_dir / LOG_FILE):  # a FIFO there is read, and refused
        return -1
    return max((int(r.get("step", -1)) for r in read_log(run_dir)), default=-1)


def _check_same_settings(config: TrainConfig, written: dict[str, Any], where: Path) -> None:
    """Refuse a run written with settings other than ``config``'s (``steps`` and the
    observational settings may differ)."""
    # compared as config.json holds them: a tuple setting (report_to) reads back as a list
    wanted = json.loads(json_text(config_dict(config), default=str))
    written = json.loads(json_text(written, default=str))
    also = {"steps"} | ({"backend"} if wanted.get("backend") == "auto" else set())
    differ = setting_differences(wanted, written, frozenset(also))  # auto: runs record its pick
    if differ:
        key = differ[0]
        raise InputError(
            f"{where} was written with {key} = {written.get(key)!r}, the configuration says "
            f"{wanted.get(key)!r}; move that run away or train it with its own settings"
        )


def check_run_holds(run_dir: Path, written: dict[str, Any], seed: int | None = None) -> None:
    """A run folder proves what it holds: the seed its config records against the seed
    its name says (``seed-S``) and, when given, the seed the command asks for. After
    ``cp -a run/seed-0 run/seed-1``, ``train --seeds 0,1`` said "finished, skipping" for
    both and train-figures drew two seeds of one run."""
    recorded = written.get("seed")
    named = run_dir.name[len(SEED_PREFIX) :] if run_dir.name.startswith(SEED_PREFIX) else ""
    for what, wanted in (("its name", int(named) if named.isdigit() else None), ("--seeds", seed)):
        if wanted is not None and recorded != wanted:
            raise InputError(
                f"{run_dir} holds a run of seed {recorded!r} (its config), not seed {wanted} "
                f"as {what} says: a copied or renamed run folder; move it away, or rerun that "
                "seed into a new folder"
            )


def check_arm_seeds(arm_dir: Path, runs: Sequence[tuple[Path, dict[str, Any]]]) -> None:
    """Each run of an arm is its own seed: its config's seed matches its folder's name, and
    no two runs record one seed."""
    seen: dict[Any, Path] = {}
    for run_dir, config in runs:
        check_run_holds(run_dir, config)
        other = seen.setdefault(config.get("seed"), run_dir)
        if other != run_dir:
            raise InputError(
                f"{arm_dir}: runs {other.name} and {run_dir.name} are both seed "
                f"{config.get('seed')!r} (their configs): one run copied; remove one"
            )


def run_state(config: TrainConfig) -> tuple[str, Path | None]:
    """("finished", None), ("resume", latest checkpoint), ("restart", None) or ("new", None)
    for one seed's run."""
    run_dir = Path(config.run_dir)
    found = checkpoints(run_dir)
    if found:
        state_config = load_trainer_state(found[-1])["config"]
        check_run_holds(run_dir, state_config, config.seed)
        _check_same_settings(config, state_config, found[-1])
    if last_logged_step(run_dir) >= config.steps:
        recorded = read_run_config(run_dir / "config.json")
        check_run_holds(run_dir, recorded, config.seed)
        _check_same_settings(config, recorded, run_dir / "config.json")
        return "finished", None
    if found:
        return "resume", found[-1]
    if last_logged_step(run_dir) < 0:
        return "new", None
    recorded = read_run_config(run_dir / "config.json")
    check_run_holds(run_dir, recorded, config.seed)
    _check_same_settings(config, recorded, run_dir / "config.json")
    return "restart", None


RESTARTED = (LOG_FILE, "rollouts", "eval", "tensorboard", CHECKPOINTS_DIR)
"""What a run stopped before its first checkpoint leaves that its restart writes anew."""


def clear_partial_run(run_dir: Path) -> None:
    """Delete a run's partial log and outputs (:data:`RESTARTED`) so that it starts again:
    with no complete checkpoint nothing of it can be resumed, and training refuses to
    append a new run to an old log."""
    for name in RESTARTED:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (0: keep all)."""
    if keep > 0:
        for old in checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old)


def train_seeds(
    config: TrainConfig,
    seeds: Sequence[int],
    on_record: Callable[[Record], None] | None = None,
    on_run: Callable[[TrainConfig, str], None] | None = None,
    keep_checkpoints: int = 0,
    force: bool = False,
    progress: Any = None,
) -> list[Path]:
    """Train ``config`` once per seed, in ``run_dir/seed-S``, skipping finished runs,
    resuming interrupted ones and restarting those stopped before their first checkpoint;
    returns the runs' directories.

    ``on_run(config, state)`` is told each seed's run and what happens to it (finished,
    resume, restart, new) before it starts; ``progress`` shows each run's reference cache
    build and set-up notes, as for one run (:func:`~basis_bench.train.loop.train`).
    """
    from basis_bench.train.loop import train

    if not seeds:
        raise InputError("--seeds: give at least one seed")
    if len(set(seeds)) != len(seeds):
        raise InputError(f"--seeds: a seed is given twice ({', '.join(map(str, seeds))})")
    configs = [seed_config(config, s) for s in seeds]  # every seed checked before any runs
    done = []
    for one in configs:
        state, checkpoint = run_state(one)
        if on_run is not None:
            on_run(one, state)
        if state != "finished":
            run_dir = Path(one.run_dir)
            if state == "restart":
                clear_partial_run(run_dir)

            def record(r: Record, run_dir: Path = run_dir) -> None:
                prune_checkpoints(run_dir, keep_checkpoints)
                if on_record is not None:
                    on_record(r)

            train(one, resume=checkpoint, on_record=record, force=force, progress=progress)
        done.append(Path(one.run_dir))
    return done


def read_run_config(path: Path) -> dict[str, Any]:
    """A finished run's config.json through the package's one small-file reader: missing,
    not a regular file (a FIFO), not UTF-8 or not a JSON object is one line (it was a
    ``json.loads`` traceback, or a wait on a FIFO)."""
    from basis_bench.guards import bounded_json
    from basis_bench.guards.folders import read_small

    raw = read_small(path)
    try:
        data = bounded_json.loads(raw.decode("utf-8")) if raw is not None else None
    except (UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{path}: not a readable run configuration ({err})") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: not a run configuration (a JSON object); rerun this seed")
    return data
