"""The SPO tracker's own replay: stored checkpoints in training order, one tracker per repeat.

A one-step estimator sees one checkpoint at a time; the SPO tracker (Xu & Ding 2025) carries
a Beta posterior per prompt across steps, so its error at a checkpoint depends on every reward
it saw before. The replay, per repeat:

* initialise the tracker from the reference cache (the reference policy's first ``ref_n``
  samples of each prompt, :func:`basis_bench.estimators.related.spo_prior`);
* for each checkpoint in order, run ``epochs_per_checkpoint`` epochs; an epoch shuffles the
  prompts and walks them in batches of B (a last partial batch is dropped, like a training
  data loader with drop_last); each prompt of a batch gets one reward, drawn uniformly from
  the checkpoint's pool; its baseline is the tracker's value before that reward, whose
  squared error against the checkpoint's oracle is recorded; then the tracker updates.

Oracle and pool follow ``basis-bench evaluate``: the oracle is the mean of a checkpoint's
first ``oracle_n`` samples (by sample_idx), the pool the rest. Only prompts with a reference
sample and rollouts at every checkpoint take part (the tracker follows each prompt through
all of them); :func:`tracker_prompts` says which and how many are dropped. Repeats run as
one (R, P) array, so the Python loop is over checkpoints and epochs only. Pool draws are with
replacement across epochs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators.related import SPO_DECAY, spo_prior, spo_step
from basis_bench.rollouts.store import reward_matrix

ESTIMATOR_NAME = "spo_tracker"
Z_95 = 1.959963984540054


def tracker_prompts(
    rollouts: pl.DataFrame, reference: str, checkpoints: Sequence[str]
) -> tuple[np.ndarray, int]:
    """Sorted prompt ids present in the reference and every checkpoint, and how many are dropped."""
    policies = set(rollouts["policy"].unique().to_list())
    missing = [p for p in (reference, *checkpoints) if p not in policies]
    if missing:
        raise InputError(
            f"policy {missing[0]!r} has no rollouts; present: {', '.join(sorted(policies))}"
        )
    if len(set(checkpoints)) != len(checkpoints) or not checkpoints:
        raise InputError("checkpoints must be a non-empty sequence of distinct policies, in order")
    sets = [
        set(rollouts.filter(pl.col("policy") == p)["prompt_id"].unique().to_list())
        for p in (reference, *checkpoints)
    ]
    common = set.intersection(*sets)
    everywhere = set.union(*sets)
    if not common:
        raise InputError("no prompt has rollouts from the reference and every checkpoint")
    return np.array(sorted(common), dtype=object), len(everywhere) - len(common)


def _split(rewards: np.ndarray, oracle_n: int, checkpoint: str) -> tuple[np.ndarray, ...]:
    """Oracle mean, oracle noise, pool and pool sizes of a (P, S) NaN-padded reward matrix."""
    counts = np.isfinite(rewards).sum(axis=1)
    if counts.min() < oracle_n + 1:
        raise InputError(
            f"checkpoint {checkpoint!r}: a prompt has {int(counts.min())} samples, fewer than "
            f"oracle-n {oracle_n} + 1 (the pool needs at least one); lower oracle_n"
        )
    oracle = rewards[:, :oracle_n]
    return (
        oracle.mean(axis=1),
        oracle.var(axis=1, ddof=1) / oracle_n,
        rewards[:, oracle_n:],
        counts - oracle_n,
    )


def replay_tracker(
    rollouts: pl.DataFrame,
    reference: str,
    checkpoints: Sequence[str],
    batch_size: int = 64,
    repeats: int = 100,
    epochs_per_checkpoint: int = 1,
    oracle_n: int = 256,
    ref_n: int = 64,
    decay: float = SPO_DECAY,
    prior: float = 0.5,
    weight: float | None = None,
    seed: int = 0,
) -> pl.DataFrame:
    """Replay the SPO tracker over ``checkpoints`` in order; one summary row per checkpoint.

    ``rollouts`` is a frame in the store's schema (e.g. :func:`basis_bench.rollouts.store.load_rollouts`).
    Columns, as in ``evaluate``'s summary.csv: checkpoint, estimator, rollouts_per_prompt, mse,
    mse_noise_corrected (minus the oracle's own variance), ci_low, ci_high (normal 95% over
    repeats), extreme_rate (share of baselines exactly 0 or 1), n_estimates.
    """
    if oracle_n < 2:
        raise InputError(
            f"oracle_n must be at least 2 (its noise estimate needs a variance); got {oracle_n}"
        )
    if ref_n < 1 or repeats < 1 or epochs_per_checkpoint < 1:
        raise InputError("ref_n, repeats and epochs_per_checkpoint must be at least 1")
    ids, _ = tracker_prompts(rollouts, reference, checkpoints)
    p = len(ids)
    if not 1 <= batch_size <= p:
        raise InputError(
            f"batch_size must be in [1, {p}] (the prompts every checkpoint shares); got {batch_size}"
        )
    cache = reward_matrix(rollouts, reference, ids)[:, :ref_n]
    alpha0, beta0 = spo_prior(cache, decay=decay, prior=prior, weight=weight)
    alpha = np.tile(alpha0, (repeats, 1))
    beta = np.tile(beta0, (repeats, 1))
    rng = np.random.default_rng(seed)
    per_epoch = (p // batch_size) * batch_size
    rows = []
    for checkpoint in checkpoints:
        oracle, noise, pool, pool_count = _split(
            reward_matrix(rollouts, checkpoint, ids), oracle_n, checkpoint
        )
        sq_sum = np.zeros(repeats)
        noise_sum = 0.0
        extreme = 0
        for _ in range(epochs_per_checkpoint):
            index = np.argsort(rng.random((repeats, p)), axis=1)[:, :per_epoch]
            col = np.floor(rng.random(index.shape) * pool_count[index]).astype(np.int64)
            rewards = pool[index, col]
            baselines = spo_step(alpha, beta, index, rewards, decay)
            sq_sum += ((baselines - oracle[index]) ** 2).sum(axis=1)
            noise_sum += float(noise[index].sum())
            extreme += int(((baselines == 0) | (baselines == 1)).sum())
        per_repeat = epochs_per_checkpoint * per_epoch
        mse_r = sq_sum / per_repeat
        n = repeats * per_repeat
        mse = float(mse_r.mean())
        half = Z_95 * float(mse_r.std(ddof=1)) / math.sqrt(repeats) if repeats > 1 else math.nan
        rows.append(
            {
                "checkpoint": checkpoint,
                "estimator": ESTIMATOR_NAME,
                "rollouts_per_prompt": 1,
                "mse": mse,
                "mse_noise_corrected": mse - noise_sum / n,
                "ci_low": mse - half,
                "ci_high": mse + half,
                "extreme_rate": extreme / n,
                "n_estimates": n,
            }
        )
    return pl.DataFrame(rows)
