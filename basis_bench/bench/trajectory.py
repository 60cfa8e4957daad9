"""Trajectory replay: every estimator over the stored checkpoints in training order.

A one-step replay sees one checkpoint at a time; training is a sequence of checkpoints in
which a prompt comes back once per epoch, and stateful estimators (the SPO tracker,
``basis_memory``, BASIS with ``previous`` calibration) carry what they saw before. The
replay, per repeat (R repeats run as parallel streams of one
:class:`~basis_bench.estimators.StepEstimator` each, so the Python loop is over steps and
estimators only, never over prompts or repeats):

* every estimator starts from its initial state (built from the reference cache: the
  reference policy's first ``ref_n`` samples of each prompt);
* for each checkpoint in order, run ``epochs_per_checkpoint`` epochs; an epoch shuffles the
  prompts and walks them in batches of B (a last partial batch is dropped, like a training
  data loader with drop_last); each visit of a prompt draws fresh rewards from the
  checkpoint's pool: one for single-rollout estimators, G (without replacement) for the
  group ones, all estimators sharing the draw (the single ones take the first); each
  step's baselines are scored against the checkpoint's oracle, then the state moves on.

With ``blend``, the policy moves from each checkpoint to the next over the checkpoint's
epochs instead of jumping: in epoch e (0-based) of E, each rollout comes from the next
checkpoint with probability w = e / E, else from this one (a mixture policy, a real policy
whose value is (1 - w) V_c + w V_{c+1}, the oracle used; its noise (1 - w)^2 and w^2 times
the two oracles' noise). The last checkpoint has no next and stays put. Column
``next_share`` is w (its mean over the epochs in checkpoint rows); 0 without blending.

Oracle and pool follow ``basis-bench evaluate``: the oracle is the mean of a checkpoint's
first ``oracle_n`` samples (by sample_idx), the pool the rest. Only prompts with a reference
sample and rollouts at every checkpoint take part (:func:`tracker_prompts`). Pool draws are
with replacement across visits. The result has one row per (checkpoint, epoch, estimator)
(scope ``epoch``) and one per (checkpoint, estimator) over its epochs (scope
``checkpoint``): MSE, noise-corrected MSE (minus the oracle's own variance), a normal 95%
CI over repeats, and the share of baselines exactly 0 or 1.

:func:`replay_tracker` is the SPO tracker's summary rows of ``evaluate`` (single-rollout
draws only), kept for its summary.csv rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from basis_bench.bench.replay import draw_rollouts
from basis_bench.errors import InputError
from basis_bench.estimators import (
    Estimator,
    SpoOptions,
    StepEstimator,
    TiltTable,
    default_betas,
    get,
    make_kernel,
)
from basis_bench.estimators.options import DEFAULT_PRIOR
from basis_bench.estimators.related import SPO_DECAY
from basis_bench.rollouts.features import prompt_features
from basis_bench.rollouts.store import reward_matrix

ESTIMATOR_NAME = "spo_tracker"
Z_95 = 1.959963984540054
SUMMARY_COLUMNS = (
    "estimator", "rollouts_per_prompt", "mse", "mse_noise_corrected", "ci_low", "ci_high",
    "extreme_rate", "n_estimates",
)  # fmt: skip


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


class _Split(NamedTuple):
    """A checkpoint's oracle (P,), the oracle's noise (P,), its pool (P, S) and pool sizes (P,)."""

    oracle: np.ndarray
    noise: np.ndarray
    pool: np.ndarray
    pool_count: np.ndarray


def _split(rewards: np.ndarray, oracle_n: int, checkpoint: str, need: int) -> _Split:
    """Oracle mean, oracle noise, pool and pool sizes of a (P, S) NaN-padded reward matrix."""
    counts = np.isfinite(rewards).sum(axis=1)
    if counts.min() < oracle_n + need:
        raise InputError(
            f"checkpoint {checkpoint!r}: a prompt has {int(counts.min())} samples, fewer than "
            f"oracle-n {oracle_n} + {need} (the pool needs at least {need}); lower oracle_n"
        )
    oracle = rewards[:, :oracle_n]
    return _Split(
        oracle.mean(axis=1),
        oracle.var(axis=1, ddof=1) / oracle_n,
        rewards[:, oracle_n:],
        counts - oracle_n,
    )


@dataclass(frozen=True)
class TrajectorySettings:
    """The knobs of one trajectory replay."""

    batch_size: int = 64
    repeats: int = 100
    epochs_per_checkpoint: int = 1
    group_size: int = 8
    oracle_n: int = 256
    ref_n: int = 64
    seed: int = 0
    grid_size: int | None = None  # finite betas of the tilt table; None: the default grid
    prior: float = DEFAULT_PRIOR
    options: Mapping[str, Any] = field(default_factory=dict)
    blend: bool = False  # move from each checkpoint towards the next over its epochs
    features: str = "auto"  # prompt features for basis_context (rollouts/features.py kinds)


@dataclass
class _Track:
    """One estimator's parallel streams and its running sums over one checkpoint."""

    step: StepEstimator
    g: int
    sq_ckpt: np.ndarray
    extreme_ckpt: float = 0.0
    extreme_last: float = 0.0  # 0/1 baselines of the latest epoch, per prompt (/ G)
    curve: list[float] = field(default_factory=list)  # mean squared error of each step


def _summary(
    sq_sum: np.ndarray, per_repeat: int, noise_sum: float, extreme: float
) -> dict[str, float | int]:
    """MSE, noise-corrected MSE, normal 95% CI over repeats, 0/1 share, count."""
    repeats = sq_sum.shape[0]
    mse_r = sq_sum / per_repeat
    n = repeats * per_repeat
    mse = float(mse_r.mean())
    half = Z_95 * float(mse_r.std(ddof=1)) / math.sqrt(repeats) if repeats > 1 else math.nan
    return {
        "mse": mse,
        "mse_noise_corrected": mse - noise_sum / n,
        "ci_low": mse - half,
        "ci_high": mse + half,
        "extreme_rate": extreme / n,
        "n_estimates": n,
    }


def _reward_range(*arrays: np.ndarray) -> tuple[float, float] | None:
    vals = np.concatenate([a[np.isfinite(a)] for a in arrays])
    return (0.0, 1.0) if vals.size == 0 or (vals.min() >= 0 and vals.max() <= 1) else None


def check_blend(epochs_per_checkpoint: int, n_checkpoints: int) -> None:
    """Blending moves from one checkpoint to the next over its epochs: it needs both."""
    if epochs_per_checkpoint < 2 or n_checkpoints < 2:
        raise InputError(
            "blending moves from one checkpoint to the next over its epochs: it needs at least "
            f"2 checkpoints and 2 epochs per checkpoint; got {n_checkpoints} and "
            f"{epochs_per_checkpoint}"
        )


def _check(
    settings: TrajectorySettings, estimators: Sequence[Estimator], p: int, n_checkpoints: int
) -> int:
    """Validate the settings; the number of rollouts drawn per visit (G_max)."""
    s = settings
    if s.oracle_n < 2:
        raise InputError(
            f"oracle_n must be at least 2 (its noise estimate needs a variance); got {s.oracle_n}"
        )
    if s.ref_n < 1 or s.repeats < 1 or s.epochs_per_checkpoint < 1:
        raise InputError("ref_n, repeats and epochs_per_checkpoint must be at least 1")
    if not 1 <= s.batch_size <= p:
        raise InputError(
            f"batch_size must be in [1, {p}] (the prompts every checkpoint shares); got {s.batch_size}"
        )
    if not estimators:
        raise InputError("trajectory replay needs at least one estimator")
    if s.blend:
        check_blend(s.epochs_per_checkpoint, n_checkpoints)
    has_group = any(e.group for e in estimators)
    if has_group and s.group_size < 2:
        raise InputError(f"group estimators need group_size >= 2; got {s.group_size}")
    return s.group_size if has_group else 1


def replay_trajectory(
    rollouts: pl.DataFrame,
    reference: str,
    checkpoints: Sequence[str],
    estimators: Sequence[str | Estimator],
    settings: TrajectorySettings | None = None,
    progress: Callable[[str, int], None] | None = None,
    prompts: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """Replay ``estimators`` over ``checkpoints`` in order; rows per epoch and per checkpoint.

    ``rollouts`` is a frame in the store's schema. Returns the table (columns: scope,
    checkpoint, epoch, step, then evaluate's summary columns) and each estimator's per-step
    MSE curve (steps,) keyed by its label. ``settings.options`` maps an estimator name to
    its options (object or mapping). ``progress(checkpoint, epoch)`` after every epoch.
    ``prompts``: the prompts table, whose features (``settings.features``) go to the tilt
    table for the estimators that condition on the prompt.
    """
    s = settings or TrajectorySettings()
    ests = [get(e) if isinstance(e, str) else e for e in estimators]
    ids, _ = tracker_prompts(rollouts, reference, checkpoints)
    p = len(ids)
    g_max = _check(s, ests, p, len(checkpoints))
    cache = reward_matrix(rollouts, reference, ids)[:, : s.ref_n]

    betas = default_betas(s.grid_size) if s.grid_size is not None else None
    features = prompt_features(prompts, list(ids), s.features)  # None: no prompts table
    table = TiltTable.from_cache(cache, betas, s.prior, list(ids), features)
    splits = [_split(reward_matrix(rollouts, c, ids), s.oracle_n, c, g_max) for c in checkpoints]
    rr = _reward_range(cache, *(sp.pool for sp in splits))
    tracks = {}
    for e in ests:
        opts = e.parse_options(s.options.get(e.name))
        kernel = make_kernel(e, opts, table if e.uses_cache else None, cache, rr)
        step = StepEstimator(e, opts, kernel, table, rr, lead=(s.repeats,))
        tracks[e.name] = _Track(step, e.rollouts_per_prompt(s.group_size), np.zeros(s.repeats))
    rng = np.random.default_rng(s.seed)
    b = s.batch_size
    per_epoch = (p // b) * b
    rows: list[dict[str, Any]] = []
    step_count = 0
    for ck, (checkpoint, split) in enumerate(zip(checkpoints, splits, strict=True)):
        following = splits[ck + 1] if s.blend and ck + 1 < len(splits) else None
        for t in tracks.values():
            t.sq_ckpt = np.zeros(s.repeats)
            t.extreme_ckpt = 0.0
        noise_ckpt = share_sum = 0.0
        for epoch in range(s.epochs_per_checkpoint):
            share = 0.0 if following is None else epoch / s.epochs_per_checkpoint
            share_sum += share
            index = np.argsort(rng.random((s.repeats, p)), axis=1)[:, :per_epoch]
            rewards = _draw(rng, split, index, g_max)
            oracle, noise = split.oracle, split.noise
            if following is not None and share > 0:
                # the mixture policy: each rollout is the next checkpoint's with probability share
                later = _draw(rng, following, index, g_max)
                rewards = np.where(rng.random(rewards.shape) < share, later, rewards)
                oracle = (1 - share) * oracle + share * following.oracle
                noise = (1 - share) ** 2 * noise + share**2 * following.noise
            noise_sum = float(noise[index].sum())
            noise_ckpt += noise_sum
            epoch_sq = _run_epoch(tracks, index, rewards, oracle, b)
            step_count += per_epoch // b
            for name, t in tracks.items():
                sq = epoch_sq[name]
                extreme = t.extreme_last
                t.sq_ckpt += sq.sum(axis=1)
                t.extreme_ckpt += extreme
                rows.append(
                    {
                        "scope": "epoch", "checkpoint": checkpoint, "checkpoint_index": ck,
                        "epoch": ck * s.epochs_per_checkpoint + epoch + 1, "step": step_count,
                        "next_share": share, "estimator": name, "rollouts_per_prompt": t.g,
                        **_summary(sq.sum(axis=1), per_epoch, noise_sum, extreme),
                    }
                )  # fmt: skip
            if progress is not None:
                progress(checkpoint, epoch + 1)
        share_ckpt = share_sum / s.epochs_per_checkpoint
        for name, t in tracks.items():
            rows.append(
                {
                    "scope": "checkpoint", "checkpoint": checkpoint, "checkpoint_index": ck,
                    "epoch": None, "step": step_count, "next_share": share_ckpt,
                    "estimator": name, "rollouts_per_prompt": t.g,
                    **_summary(t.sq_ckpt, s.epochs_per_checkpoint * per_epoch, noise_ckpt,
                               t.extreme_ckpt),
                }
            )  # fmt: skip
    curves = {name: np.asarray(t.curve) for name, t in tracks.items()}
    return pl.DataFrame(rows, schema_overrides={"epoch": pl.Int64}), curves


def _draw(rng: np.random.Generator, split: _Split, index: np.ndarray, g_max: int) -> np.ndarray:
    """One visit's rewards (R, per_epoch, g_max) for the prompts ``index`` from a checkpoint's
    pool: one draw per visit, or g_max without replacement."""
    pool, pool_count = split.pool, split.pool_count
    if g_max == 1:
        col = np.floor(rng.random(index.shape) * pool_count[index]).astype(np.int64)
        return pool[index, col][..., None]
    cols = draw_rollouts(rng, pool_count[index], g_max, pool.shape[1])
    return pool[index[..., None], cols]


def _run_epoch(
    tracks: Mapping[str, _Track],
    index: np.ndarray,
    rewards: np.ndarray,
    oracle: np.ndarray,
    b: int,
) -> dict[str, np.ndarray]:
    """Every estimator over one epoch's batches, in order: squared errors (R, per_epoch)."""
    out: dict[str, np.ndarray] = {}
    for name, t in tracks.items():
        base = np.empty((*index.shape, t.g))
        for start in range(0, index.shape[1], b):
            sl = slice(start, start + b)
            res = t.step.step_columns(index[:, sl], rewards[:, sl, : t.g])
            base[:, sl] = np.asarray(res.baselines, dtype=np.float64)
            t.curve.append(float(((base[:, sl] - oracle[index[:, sl], None]) ** 2).mean()))
        out[name] = ((base - oracle[index][..., None]) ** 2).mean(axis=-1)
        extreme = int(((base == 0) | (base == 1)).sum())
        t.extreme_last = extreme if t.g == 1 else extreme / t.g
    return out


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
    """The SPO tracker's trajectory replay; one summary row per checkpoint.

    Columns, as in ``evaluate``'s summary.csv: checkpoint, estimator, rollouts_per_prompt,
    mse, mse_noise_corrected, ci_low, ci_high, extreme_rate, n_estimates.
    """
    options = SpoOptions(decay=decay, prior=prior, weight=weight)
    settings = TrajectorySettings(
        batch_size, repeats, epochs_per_checkpoint, 1, oracle_n, ref_n, seed,
        options={ESTIMATOR_NAME: options},
    )  # fmt: skip
    table, _ = replay_trajectory(rollouts, reference, checkpoints, [ESTIMATOR_NAME], settings)
    return table.filter(pl.col("scope") == "checkpoint").select("checkpoint", *SUMMARY_COLUMNS)
