"""`basis-bench train`: a compact RLVR training loop with the advantage estimator as a plug-in.

In the spirit of cleanrl, the algorithm is :func:`train`, read top to bottom. One step t:

1. **prompts**: B_p = rollouts_per_step / G' prompts, G' = ``group_size`` for group
   estimators (GRPO, RLOO) and 1 otherwise, so every estimator gets the same rollout budget.
   Prompts come without replacement from a fresh permutation of the training set per epoch.
2. **sample**: G' responses per prompt from the current policy (``hf`` generate, or vLLM with
   the policy's weights copied in after every update), keeping the sampled token ids.
3. **reward**: math-verify scores them: r (B_p, G').
4. **estimate**: baselines b (B_p, G') from the estimator that
   :func:`~basis_bench.train.setup.make_estimator` builds (BASIS variants also report the
   calibrated beta_t); advantages A = r - b, optionally normalised.
5. **update**: ``epochs`` passes over ``minibatches`` minibatches of the step's responses,
   one AdamW step each on the registered policy loss named ``loss``
   (:mod:`basis_bench.train.losses`) plus ``kl_coef`` times the k3 KL to the frozen
   reference, after clipping the gradient norm (:mod:`basis_bench.train.update`).
6. **record**: the step's rollouts and one log record; held-out accuracy, the value probe
   (:mod:`basis_bench.train.probe`, observational) and a checkpoint when due.

Everything before step 1 is :func:`~basis_bench.train.setup.setup` (data, models, sampler,
the reference cache for estimators that use it); checkpoints and ``--resume`` are
:mod:`basis_bench.train.checkpoint`. Step 0 of the log is the initial held-out accuracy
(and value probe).

Run directory::

    RUN/config.json              the resolved configuration and its provenance
    RUN/log.jsonl                one JSON record per step (step 0: the initial held-out accuracy)
    RUN/prompts.parquet          training and held-out prompts
    RUN/rollouts/train-T.parquet step T's rollouts (policy "train-T"), rollouts schema
    RUN/eval/greedy-T.parquet    held-out greedy responses after step T (policy "greedy-T")
    RUN/checkpoints/step-T/      save_pretrained model + tokenizer, trainer_state.pt
    RUN/tensorboard/             event files, with report_to = ["tensorboard"]
                                 (:mod:`basis_bench.train.tracking`)
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators import StepOutput
from basis_bench.estimators.normalise import normalise_advantages
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import appended_inside
from basis_bench.guards.outputs import holds_output_locks, json_text, naming_failed_writes
from basis_bench.train.config import TrainConfig, config_dict
from basis_bench.train.sample import (
    Rollouts,
    derive_seed,
    sample_rollouts,
    score_rollouts,
    step_prompt_indices,
)
from basis_bench.train.setup import LOG_FILE, Run
from basis_bench.train.tracking import Trackers, check_reporters, open_trackers

Record = dict[str, Any]


# --------------------------------------------------------------------------- the loop


def sample_step(run: Any, train_set: Any, sampling: Any, step: int) -> tuple[Any, Any]:
    """Step ``step``'s prompts (the seeded schedule) and G' responses each from the policy."""
    seed = run.config.seed
    batch = train_set[step_prompt_indices(train_set.height, run.prompts_per_step, step, seed)]
    run.models.policy.eval()
    rollouts = sample_rollouts(run.sampler, batch, sampling, derive_seed(seed, step))
    return batch, rollouts


@holds_output_locks
def train(
    config: TrainConfig,
    resume: str | os.PathLike[str] | None = None,
    on_record: Callable[[Record], None] | None = None,
    force: bool = False,
    progress: Any = None,
) -> Path:
    """Run (or, from a checkpoint, continue) training; returns the run directory.

    ``on_record`` receives each log record as it is written (for progress output);
    ``progress`` shows the reference cache's build (see :func:`~basis_bench.train.setup.setup`).
    ``force`` lets ``run_dir`` be a folder that holds something other than a training run.
    """
    from basis_bench.train.setup import sync_sampler
    from basis_bench.train.update import update_policy

    run, start, trackers = _start(config, resume, force, progress)
    log = open_run(run, start, on_record, trackers)
    train_set, policy = run.data.train_set, run.models.policy
    sampling = config.generation.sampling(run.group, config.train.prompts)
    try:
        if start == 1 and (config.heldout_every or config.probe_every):
            log(initial_record(run))

        for step in range(start, config.steps + 1):
            timer = Timer()
            # 1-2. this step's prompts, and G' responses each from the current policy
            with timer("sample"):
                batch, rollouts = sample_step(run, train_set, sampling, step)

            # 3. rewards r (B_p, G')
            with timer("reward"):
                rewards, statuses = score_rollouts(
                    rollouts.responses,
                    batch,
                    run.data,
                    rollouts.response_tokens,
                    rollouts.finish_reasons,
                )

            # 4. baselines b and advantages A = r - b (B_p, G')
            with timer("estimate"):
                estimate = run.estimator(batch["prompt_id"].to_list(), rewards)
                baselines = np.asarray(estimate.baselines, dtype=np.float64)
                advantages = normalise_advantages(
                    rewards - baselines, rewards, config.advantage_norm
                )

            # 5. policy update over the step's N = B_p G' responses
            with timer("update"):
                policy.train()  # no dropout in these models; enables gradient checkpointing
                stats = update_policy(
                    policy,
                    run.models.optimizer,
                    run.models.reference,
                    [p for p in rollouts.prompt_tokens for _ in range(run.group)],
                    rollouts.response_tokens,
                    advantages.reshape(-1),
                    config,
                    np.random.default_rng([config.seed, step]),
                    run.models.tokenizer.pad_token_id,
                    step,
                )
                policy.eval()
            # step t + 1 samples from the weights of step t (vllm: copied into the engine)
            with timer("sync"):
                sync_sampler(run.sampler, policy)

            # 6. record: the rollouts, the step's statistics, evaluation and checkpoint
            write_step_rollouts(run, step, batch, rollouts, rewards, statuses)
            record = step_record(step, run, rollouts, rewards, estimate, advantages, stats)
            when_due(run, step, record, timer)
            record["seconds"] = timer.seconds
            log(record)
    finally:
        trackers.close()
        if run.data.pool is not None:
            run.data.pool.shutdown()
    return run.run_dir


def _start(
    config: TrainConfig, resume: str | os.PathLike[str] | None, force: bool, progress: Any
) -> tuple[Run, int, Trackers]:
    """The run set up (restored from ``resume``), its first step, and its trackers, opened
    once run_dir is claimed and before a model loads: one that cannot start (wandb's init
    without a login) was one line only after the model had loaded."""
    from basis_bench.train.checkpoint import load_trainer_state, restore
    from basis_bench.train.setup import setup, sync_sampler

    check_reporters(config.report_to)
    opened: list[Trackers] = []

    def open_early() -> None:
        first = 1 if resume is None else int(load_trainer_state(resume)["step"]) + 1
        opened.append(
            open_trackers(config.report_to, Path(config.run_dir), config_dict(config), first)
        )

    try:
        run = setup(config, resume, force, progress, before_models=open_early)
        start = restore(run, resume) if resume is not None else 1
        if resume is not None:
            sync_sampler(run.sampler, run.models.policy)
    except BaseException:
        for early in opened:  # nothing was trained: what their start wrote goes too
            early.discard()
        raise
    return run, start, opened[0]


def when_due(run: Run, step: int, record: Record, timer: Timer) -> None:
    """After step ``step``, what is due of: held-out accuracy, the value probe (into
    ``record``) and a checkpoint, each timed by ``timer``."""
    from basis_bench.train.checkpoint import save_run_checkpoint
    from basis_bench.train.probe import value_probe

    config = run.config
    if due(step, config.heldout_every, config.steps):
        with timer("eval"):
            record.update(heldout_evaluation(run, step))
    if due(step, config.probe_every, config.steps):
        with timer("probe"):
            record.update(value_probe(run, step))
    if due(step, config.checkpoint_every, config.steps):
        with timer("checkpoint"):
            save_run_checkpoint(run, step)


# --------------------------------------------------------------------------- schedule


def due(step: int, every: int, last: int) -> bool:
    """Whether a periodic action (every ``every`` steps, 0 = never) runs after ``step``;
    it also runs after the last step."""
    return bool(every) and (step % every == 0 or step == last)


# --------------------------------------------------------------------------- advantages and held-out accuracy


def heldout_evaluation(run: Run, step: int) -> Record:
    """Held-out accuracy of greedy responses (``eval_accuracy``) and the policy measures of
    :mod:`basis_bench.train.policy_measures`; the responses go to RUN/eval/greedy-T.parquet."""
    from basis_bench.guards.outputs import write_parquet_atomic
    from basis_bench.rollouts.sampling import SamplingConfig
    from basis_bench.rollouts.trainer_prompts import model_inputs
    from basis_bench.train.policy_measures import heldout_measures

    config, heldout_set = run.config, run.data.heldout_set
    tokens = (
        config.heldout_max_new_tokens
        or config.generation.sampling(1, config.heldout_prompts).max_new_tokens
    )
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=tokens)
    sampled = run.sampler.sample_tokens(model_inputs(heldout_set), greedy, seed=0)
    samples = run.sampler.decode(sampled)
    answers = heldout_set["answer"].to_list()
    rewards, statuses = score_rollouts(
        samples.responses, heldout_set, run.data, sampled.response_ids, samples.finish_reasons
    )
    frame = rollout_frame(
        heldout_set["prompt_id"].to_list(),
        f"greedy-{step:06d}",
        rewards.reshape(-1),
        statuses,
        samples.responses,
        samples.n_tokens,
        samples.finish_reasons,
    )
    write_parquet_atomic(frame, run.run_dir / "eval" / f"greedy-{step:06d}.parquet")
    measures = heldout_measures(
        samples.responses, samples.finish_reasons, answers, run.data.reward, statuses, run.data.pool
    )
    return {"eval_accuracy": float(rewards.mean()), **measures}


def initial_record(run: Run) -> Record:
    """Step 0's record, of the policy before any update: held-out accuracy (when
    ``heldout_every``) and the value probe (when ``probe_every``)."""
    from basis_bench.train.probe import value_probe

    timer = Timer()
    record: Record = {"step": 0}
    if run.config.heldout_every:
        with timer("eval"):
            record.update(heldout_evaluation(run, 0))
    if run.config.probe_every:
        with timer("probe"):
            record.update(value_probe(run, 0))
    return {**record, "seconds": timer.seconds}


# --------------------------------------------------------------------------- record


class Timer:
    """Seconds per phase of a step: ``with timer("sample"): ...`` fills ``timer.seconds``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        tic = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = time.perf_counter() - tic


def step_record(
    step: int,
    run: Run,
    rollouts: Rollouts,
    rewards: np.ndarray,
    estimate: StepOutput,
    advantages: np.ndarray,
    stats: Mapping[str, float | None],
) -> Record:
    """The log record of one step (``eval_accuracy`` and ``seconds`` are added after)."""
    n_tokens = [len(r) for r in rollouts.response_tokens]
    return {
        "step": step,
        "epoch": (step * run.prompts_per_step) / run.data.train_set.height,
        "prompts": rewards.shape[0],
        "rollouts": len(rollouts.response_tokens),
        "mean_reward": float(rewards.mean()),
        "beta": estimate.beta,
        "beta_index": estimate.beta_index,
        "baseline_mean": float(np.mean(estimate.baselines, dtype=np.float64)),
        "adv_mean": float(advantages.mean()),
        "adv_std": float(advantages.std()),
        "zero_adv_share": float(np.mean(np.abs(advantages) < 1e-9)),
        "response_tokens": int(sum(n_tokens)),
        "truncated_share": float(np.mean(np.asarray(rollouts.finish_reasons) == "length")),
        **stats,
    }


def write_step_rollouts(
    run: Run,
    step: int,
    batch: pl.DataFrame,
    rollouts: Rollouts,
    rewards: np.ndarray,
    statuses: Sequence[str],
) -> Path:
    """RUN/rollouts/train-T.parquet: the step's rollouts in the store's schema."""
    from basis_bench.guards.outputs import write_parquet_atomic

    frame = rollout_frame(
        [pid for pid in batch["prompt_id"].to_list() for _ in range(run.group)],
        f"train-{step:06d}",
        rewards.reshape(-1),
        statuses,
        rollouts.responses,
        [len(r) for r in rollouts.response_tokens],
        rollouts.finish_reasons,
    )
    return write_parquet_atomic(frame, run.run_dir / "rollouts" / f"train-{step:06d}.parquet")


def rollout_frame(
    prompt_ids: Sequence[str],
    policy: str,
    rewards: np.ndarray,
    statuses: Sequence[str],
    responses: Sequence[str],
    n_tokens: Sequence[int] | np.ndarray,
    finish: Sequence[str],
) -> pl.DataFrame:
    """Rollouts in the store's schema; sample_idx numbers the rows (a prompt may recur)."""
    from basis_bench.rollouts.store import conform_rollouts

    frame = pl.DataFrame(
        {
            "prompt_id": list(prompt_ids),
            "policy": [policy] * len(prompt_ids),
            "sample_idx": np.arange(len(prompt_ids), dtype=np.int32),
            "reward": np.asarray(rewards, dtype=np.float64),
            "n_tokens": np.asarray(n_tokens, dtype=np.int32),
            "finish_reason": list(finish),
            "response": list(responses),
            "verify_status": list(statuses),
        }
    )
    return conform_rollouts(frame, what=policy)


def jsonl_line(record: Mapping[str, Any]) -> str:
    """One record as a line of strict JSON: beta = inf is written as the string "inf"."""
    return json_text(record) + "\n"


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record to a log (one line, appended whole), never through a link that
    leads out of the log's folder."""
    with (
        naming_failed_writes(path),
        open(appended_inside(path, path.parent), "a", encoding="utf-8") as fh,
    ):
        fh.write(jsonl_line(record))


def read_log(run_dir: str | os.PathLike[str]) -> list[Record]:
    """The step records of a run's ``log.jsonl`` (beta "inf" read back as a float)."""
    from basis_bench.guards.folders import read_small

    path = Path(run_dir) / LOG_FILE
    raw = read_small(path)  # a FIFO named so is refused, never waited on
    if raw is None:
        raise InputError(f"{run_dir}: no {LOG_FILE}; is this a training run directory?")
    # a record cut short by a crash mid-append is dropped: that step is redone on resume
    hint = "; is this a training run's log?"
    records = bounded_json.records(raw, str(path), cut_last=True, hint=hint)
    for r in records:
        if r.get("beta") == "inf":
            r["beta"] = math.inf
    return records


def _log(path: Path, sinks: Sequence[Callable[[Record], None] | None], record: Record) -> None:
    append_jsonl(path, record)
    for sink in sinks:
        if sink is not None:
            sink(record)


def open_run(
    run: Run, start: int, *sinks: Callable[[Record], None] | None
) -> Callable[[Record], None]:
    """Write the run directory's config.json (with provenance) and prompts, start the log
    (a resumed run keeps the records before ``start``), and return the logging function:
    it appends a record to log.jsonl, then hands it to each of ``sinks`` (progress output,
    experiment trackers)."""
    from basis_bench.guards.outputs import write_parquet_atomic, write_text_atomic
    from basis_bench.guards.provenance import provenance

    run.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run.run_dir / LOG_FILE
    kept = [r for r in read_log(run.run_dir) if r["step"] < start] if start > 1 else []
    write_text_atomic(log_path, "".join(jsonl_line(r) for r in kept))
    settings = {**config_dict(run.config), "provenance": provenance()}
    write_text_atomic(run.run_dir / "config.json", json_text(settings, indent=2) + "\n")
    prompts = pl.concat([run.data.train_set, run.data.heldout_set], how="diagonal_relaxed")
    write_parquet_atomic(prompts, run.run_dir / "prompts.parquet")
    return functools.partial(_log, log_path, sinks)
