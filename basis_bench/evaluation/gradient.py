"""Gradient quality at an equal rollout budget: what each estimator's advantages make of the
policy gradient, measured with per-rollout score sketches (``oracle --store-scores``).

At a replayed step whose policy is a checkpoint's own (the step replay's steps with weight
w = 0), each estimator's step gradient is

    G_hat = (1 / R) sum_i A_i s_i,        A_i = r_i - b_i,

over the R rollouts it spent that step (R / G prompts x G), s_i the rollout's sketched score
(:mod:`basis_bench.rollouts.score_sketch`), b_i the estimator's baseline. Every quantity
below is a quadratic form of sketches, so it is unbiased for its exact value in expectation
over the projection. Per checkpoint, over the replay's independent repeats:

* **variance** V = E||G_hat - E G_hat||^2, and its paired ratio to RLOO(G)'s on the same
  repeats, 95% interval by the delta method on the log ratio. GRPO's advantage is exactly
  (G - 1) / G of RLOO's, a scale with no directional bias, so GRPO's variance is reported
  with that scale taken out (``scale``).
* **the target** G* = (1 / P) sum_p E[r s | p] (every prompt alike, the replay's prompt
  distribution), from the folds the repeat does not draw from (its oracle folds): g_p = the
  samples' covariance of r and s (ddof 1, unbiased since E[s | p] = 0), G*_hat their mean.
  ||G*||^2 is the cross product <G*_A, G*_B> of two disjoint halves of those samples,
  unbiased with no noise model; G*_hat is independent of the repeat's draws, so
  E||G_hat||^2 - 2 E<G_hat, G*_hat> + ||G*||^2 = E||G_hat - G*||^2: the **relative error**
  E||G_hat - G*||^2 / ||G*||^2 and the **cosine** E<G_hat, G*> / sqrt(E||G_hat||^2 ||G*||^2)
  are both free of the target's own noise.
* **the split** of V: the prompt-sampling part (the variance of the mean of the step's
  prompts' own gradients g_p, in closed form from the g_p with the finite-population
  correction of prompts drawn without replacement, noise-corrected) and the rest, the
  rollout noise given the prompts under the value baseline (b = v, the prompt's value from
  the oracle folds, whose own noise Var(v_hat) ||s||^2 is taken out: ``oracle_baseline``), and
  an estimator's excess over that arm at its G, its baseline's part. b = v is not the
  least-variance baseline, E[r ||s||^2] / E[||s||^2], which differs where ||s|| depends on
  the reward (a long wrong answer has a larger score), so an estimator may come in under it
  (a negative ``var_baseline``).
* **the expected direction** of a normalised arm: E G_hat is G* for every estimator whose
  baseline leaves out the rollout's own reward (E[b s | p] = 0), but GRPO's group std (the
  ``grpo_std`` arm, A / (std_G r + eps), the training loop's ``group_std``) weights prompt
  p by about 1 / sigma_p and turns it. ``direction_cosine`` is cos(E G_hat, E G_source)
  against the arm's own estimator on the same draws (GRPO, whose E G_hat is G* up to its
  scale): the repeats of fold f draw only from f's samples, so the means m_f, m'_h of two
  folds are independent and <m_f, m'_h> (f != h) is unbiased for <E G_hat, E G'_hat>; the
  interval is a jackknife over blocks of repeats (it covers the replay's draws, not the
  sampling of the data's own samples, of which two folds give no replicate). Such an arm has no closed-form scale: its variance is
  put on G*'s scale by the measured c = <E G_hat, G*> / ||G*||^2 (``scale`` = 1 / c, its
  own noise left out of the interval).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators.normalise import normalise_advantages
from basis_bench.estimators.refine import Z_95
from basis_bench.rollouts.score_sketch import SKETCH_COLUMN
from basis_bench.rollouts.store import rollout_files, sample_cells

ORACLE_ARM = "oracle_baseline"
"""The arm whose baseline is the prompt's value from the oracle folds (b = v)."""

REFERENCE_ARM = "rloo"
"""Variances are reported as ratios to this estimator's at the same group size."""


NORMALISED_ARMS = {"grpo_std": "grpo"}
"""Arms whose advantages are an estimator's own, std-normalised as its trainer does."""

JACKKNIFE_BLOCKS = 10
"""Blocks of repeats for the expected direction's jackknife interval."""


def normalised_arms(name: str, advantages: np.ndarray, rewards: np.ndarray) -> list[tuple]:
    """(arm, advantages) of the normalised arms made from estimator ``name``'s advantages
    (..., B, G) on rewards (..., B, G): GRPO's group std (training's ``group_std``)."""
    if name != NORMALISED_ARMS["grpo_std"] or rewards.shape[-1] < 2:
        return []
    return [("grpo_std", normalise_advantages(advantages, rewards, "group_std"))]


def closed_form_scale(name: str, g: int) -> float:
    """The factor that puts an estimator's advantages on RLOO's scale: GRPO's group mean
    includes the rollout itself, r - mean_G = ((G - 1) / G)(r - mean_-i), so G / (G - 1)."""
    return g / (g - 1) if name == "grpo" and g > 1 else 1.0


def has_sketches(root: Path) -> bool:
    """Whether the dataset's rollouts carry the ``score_sketch`` column."""
    import pyarrow.parquet as pq

    return any(SKETCH_COLUMN in pq.read_schema(f).names for f in rollout_files(root))


def load_sketches(
    root: Path, policies: Sequence[str], prompt_ids: Sequence[str]
) -> dict[str, np.ndarray]:
    """Each policy's sketches as (P, S, K) float32, laid out as its reward matrix
    (:func:`~basis_bench.rollouts.store.sample_cells`; zeros where a sample is missing)."""
    frames = []
    for f in rollout_files(root):
        df = pl.read_parquet(f, columns=["prompt_id", "policy", "sample_idx", SKETCH_COLUMN])
        frames.append(df.filter(pl.col("policy").is_in(list(policies))))
    df = pl.concat(frames)
    out = {}
    for policy in policies:
        sub, rows, cols, width = sample_cells(df, policy, prompt_ids)
        vecs = np.asarray(sub[SKETCH_COLUMN].to_numpy(), dtype=np.float32)
        keep = rows >= 0
        arr = np.zeros((len(prompt_ids), width, vecs.shape[1]), np.float32)
        arr[rows[keep], cols[keep]] = vecs[keep]
        if not np.isfinite(arr).all():
            raise InputError(f"policy {policy!r}: a score sketch is not finite")
        out[policy] = arr
    return out


def _covariance(r: np.ndarray, sketches: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(P, K): each prompt's sample covariance of reward and sketch over the samples of
    ``mask`` (ddof 1): unbiased for g_p = E[r s | p], since E[s | p] = 0."""
    n = mask.sum(axis=1).astype(np.float64)
    if n.min() < 2:
        raise InputError("the gradient target needs at least 4 oracle samples of every prompt")
    r_bar = (r * mask).sum(axis=1) / n
    dev = (r - r_bar[:, None]) * mask
    return np.einsum("ps,psk->pk", dev, sketches) / (n - 1)[:, None]


@dataclass(frozen=True)
class Target:
    """One checkpoint's target gradient from each fold's oracle samples (the folds a repeat
    does not draw from): G*_hat (F, K) from all of them, and from their two halves A and B
    (alternate samples) the unbiased cross products <G*_A, G*_B> (F,) for ||G*||^2,
    sum_p <g_p,A, g_p,B> (F,) for sum_p ||g_p||^2, and ||G*_A - G*_B||^2 / 2 (F,), the
    noise of one half. Independent halves make each product unbiased, with no noise model."""

    mean: np.ndarray
    cross: np.ndarray
    per_prompt_cross: np.ndarray
    half_noise: np.ndarray
    prompts: int

    @classmethod
    def build(cls, rewards: np.ndarray, sketches: np.ndarray, rest: np.ndarray) -> Target:
        """From the (P, S) rewards, (P, S, K) sketches and (F, P, S) masks of each fold's
        oracle samples."""
        r = np.nan_to_num(rewards)
        mean, cross, per, noise = [], [], [], []
        for mask in rest:
            first = mask & ((np.cumsum(mask, axis=1) - 1) % 2 == 0)
            g_a, g_b = _covariance(r, sketches, first), _covariance(r, sketches, mask & ~first)
            a, b = g_a.mean(axis=0), g_b.mean(axis=0)
            mean.append(_covariance(r, sketches, mask).mean(axis=0))
            cross.append(float(a @ b))
            per.append(float((g_a * g_b).sum()))
            noise.append(float(((a - b) ** 2).sum()) / 2)
        return cls(
            np.stack(mean), np.asarray(cross), np.asarray(per), np.asarray(noise), r.shape[0]
        )

    def norm2(self) -> tuple[float, float]:
        """||G*||^2 (the folds' mean of <G*_A, G*_B>) and its standard error, from
        Var(<A, B>) ~ 2 ||G*||^2 N / K + N^2 / K for isotropic noise N of one half; two
        folds are disjoint (their mean halves the variance), more overlap (it does not)."""
        k, folds = self.mean.shape[1], len(self.cross)
        est = float(self.cross.mean())
        n = float(self.half_noise.mean())
        var = (2 * max(est, 0.0) * n + n * n) / k
        return est, math.sqrt(var / (2 if folds == 2 else 1))

    def prompt_variance(self, batch: int) -> float:
        """Var of the mean of ``batch`` prompts' g_p over the step's prompt draw: prompts in
        epochs without replacement (B <= P), or whole passes plus a part (B > P); the spread
        sigma^2 = (sum_p ||g_p||^2 - P ||G*||^2) / (P - 1) from the unbiased products."""
        p = self.prompts
        sigma2 = float((self.per_prompt_cross - p * self.cross).mean()) / max(p - 1, 1)
        part = batch % p if batch > p else batch
        if part == 0 or p < 2:
            return 0.0
        fpc = 1 - (part - 1) / (p - 1)
        return (part / batch) ** 2 * sigma2 / part * fpc


@dataclass
class GradientProbe:
    """Accumulates each arm's step gradients at the replay's checkpoint steps (w = 0):
    ``sums[(arm, G)][u]`` (repeats, K), divided by the step's rollouts when read."""

    sketches: list[np.ndarray]  # per checkpoint, (P, S, K)
    repeats: int
    sums: dict[tuple[str, int], dict[int, np.ndarray]] = field(default_factory=dict)
    rollouts: dict[tuple[str, int], int] = field(default_factory=dict)  # a step's R
    batches: dict[tuple[str, int], int] = field(default_factory=dict)  # a step's prompt visits
    table: pl.DataFrame = field(default_factory=pl.DataFrame)  # filled when the replay ends
    # sum_i Var(v_hat_i) ||s_i||^2 (repeats,) per step: what the oracle arm's estimated v adds
    excess: dict[tuple[str, int], dict[int, np.ndarray]] = field(default_factory=dict)

    def gather(self, k: int, cols: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """(r, b, g, K) sketches of checkpoint ``k``'s drawn samples: ``cols`` (r, b) the
        prompts, ``samples`` (r, b, g) their sample columns (gathered once a batch, shared by
        the arms that drew them)."""
        return self.sketches[k][cols[..., None], samples]

    def add(
        self, arm: str, g: int, u: int, rows: tuple[int, int], sketches: np.ndarray,
        advantages: np.ndarray, batch: int, noise: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """One batch of step ``u`` for repeats [lo, hi): ``sketches`` (r, b, g, K) of the
        rollouts (:meth:`gather`), ``advantages`` (r, b, g); ``noise`` (r, b): Var of a
        baseline estimated independently of the draws (the oracle arm's v_hat), whose
        E[eps^2 ||s||^2] share of the variance is taken out when read."""
        acc = self.sums.setdefault((arm, g), {}).setdefault(
            u, np.zeros((self.repeats, sketches.shape[-1]))
        )
        acc[rows[0] : rows[1]] += np.einsum("rbg,rbgk->rk", advantages, sketches, optimize=True)
        if noise is not None:
            extra = self.excess.setdefault((arm, g), {}).setdefault(u, np.zeros(self.repeats))
            extra[rows[0] : rows[1]] += np.einsum("rb,rbg->r", noise, (sketches**2).sum(axis=-1))
        self.rollouts[(arm, g)] = batch * g
        self.batches[(arm, g)] = batch


def _ratio_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """mean(a) / mean(b) with a 95% delta-method interval on the log ratio (pairs by row)."""
    ma, mb = a.mean(), b.mean()
    if a.size < 2 or ma <= 0 or mb <= 0:
        return float(ma / mb) if mb else math.nan, math.nan, math.nan
    cov = np.cov(np.stack([a, b]), ddof=1) / a.size
    var_log = cov[0, 0] / ma**2 + cov[1, 1] / mb**2 - 2 * cov[0, 1] / (ma * mb)
    half = Z_95 * math.sqrt(max(var_log, 0.0))
    ratio = ma / mb
    return float(ratio), float(ratio * math.exp(-half)), float(ratio * math.exp(half))


def gradient_table(
    probe: GradientProbe,
    targets: Sequence[Target],
    fold_of_repeat: np.ndarray,
    checkpoint_of_step: Mapping[int, int],
    checkpoints: Sequence[str],
    group_size: int,
) -> pl.DataFrame:
    """One row per (arm, G, checkpoint) and per (arm, G) over the checkpoints (``all``)."""
    stats: dict[tuple[str, int], dict[int, dict[str, np.ndarray]]] = {}
    for key, by_step in probe.sums.items():
        name, g = key
        r_total = probe.rollouts[key]
        scale = closed_form_scale(name, g)
        per_ckpt: dict[int, list[dict[str, np.ndarray]]] = {}
        for u, acc in by_step.items():
            k = checkpoint_of_step[u]
            est = acc / r_total * scale  # (repeats, K)
            n = est.shape[0]
            extra = probe.excess.get(key, {}).get(u, np.zeros(n)) * (scale / r_total) ** 2
            dev = ((est - est.mean(axis=0)) ** 2).sum(axis=1) * n / max(n - 1, 1) - extra
            t = targets[k]
            star = t.mean[fold_of_repeat]
            # ||G_hat - G*||^2 less the constant ||G*||^2: unbiased, G*_hat independent of G_hat
            err = (est**2).sum(axis=1) - extra - 2 * (est * star).sum(axis=1)
            per_ckpt.setdefault(k, []).append({
                "dev": dev, "err": err, "dot": (est * star).sum(axis=1),
                "sq": (est**2).sum(axis=1) - extra, "est": est,
            })  # fmt: skip
        stats[key] = {
            k: {m: np.mean([d[m] for d in ds], axis=0) for m in ds[0]} for k, ds in per_ckpt.items()
        }
    rows = []
    for (name, g), by_k in stats.items():
        ref = stats.get((REFERENCE_ARM, group_size))
        oracle = stats.get((ORACLE_ARM, g))
        scopes = [(checkpoints[k], [k]) for k in sorted(by_k)] + [("all", sorted(by_k))]
        for label, ks in scopes:
            pick = {m: np.mean([by_k[k][m] for k in ks], axis=0) for m in by_k[ks[0]]}
            norms = np.array([targets[k].norm2() for k in ks])  # (estimate, standard error)
            norm2 = float(norms[:, 0].mean())
            norm2_se = float(np.sqrt((norms[:, 1] ** 2).mean() / len(ks)))
            ratio, lo, hi = (
                _ratio_ci(pick["dev"], np.mean([ref[k]["dev"] for k in ks], axis=0))
                if ref is not None and all(k in ref for k in ks)
                else (math.nan, math.nan, math.nan)
            )
            var = float(pick["dev"].mean())
            var_prompt = float(
                np.mean([targets[k].prompt_variance(probe.batches[(name, g)]) for k in ks])
            )
            var_oracle = (
                float(np.mean([oracle[k]["dev"].mean() for k in ks]))
                if oracle is not None
                else math.nan
            )
            err = pick["err"]  # rel = 1 + mean(err) / ||G*||^2, by the delta method
            err_se = float(err.std(ddof=1)) / math.sqrt(err.size) if err.size > 1 else math.nan
            rel = 1 + float(err.mean()) / norm2 if norm2 > 0 else math.nan
            rel_se = (
                math.hypot(err_se / norm2, float(err.mean()) * norm2_se / norm2**2)
                if norm2 > 0 else math.nan
            )  # fmt: skip
            cosine = (
                float(pick["dot"].mean()) / math.sqrt(float(pick["sq"].mean()) * norm2)
                if norm2 > 0 else math.nan
            )  # fmt: skip
            source = stats.get((NORMALISED_ARMS.get(name, ""), g))
            direction = (
                _direction([by_k[k] for k in ks], [source[k] for k in ks], fold_of_repeat)
                if source is not None and all(k in source for k in ks)
                else (math.nan, math.nan, math.nan)
            )
            if name in NORMALISED_ARMS:  # on G*'s scale by the measured c
                c = float(pick["dot"].mean()) / norm2 if norm2 > 0 else math.nan
                pick["dev"] = pick["dev"] / c**2
                var = float(pick["dev"].mean())
                ratio, lo, hi = (
                    _ratio_ci(pick["dev"], np.mean([ref[k]["dev"] for k in ks], axis=0))
                    if ref is not None and all(k in ref for k in ks) and c > 0
                    else (math.nan, math.nan, math.nan)
                )
                scale = 1 / c
            else:
                scale = closed_form_scale(name, g)
            rows.append({
                "estimator": name, "rollouts_per_prompt": g,
                "rollouts_per_step": probe.rollouts[(name, g)],
                "prompts_per_step": probe.batches[(name, g)], "checkpoint": label,
                "scale": scale, "variance": var,
                "variance_ratio_rloo8": ratio, "ci_low": lo, "ci_high": hi,
                "relative_error": rel, "relative_error_ci_low": rel - Z_95 * rel_se,
                "relative_error_ci_high": rel + Z_95 * rel_se, "cosine": cosine,
                "direction_cosine": direction[0], "direction_ci_low": direction[1],
                "direction_ci_high": direction[2],
                "grad_norm2": norm2, "grad_norm2_se": norm2_se,
                "var_prompt": var_prompt, "var_rollout": var_oracle - var_prompt,
                "var_baseline": var - var_oracle, "repeats": int(err.size),
            })  # fmt: skip
    return pl.DataFrame(rows)


def _direction(
    arm: Sequence[Mapping[str, np.ndarray]], ref: Sequence[Mapping[str, np.ndarray]],
    fold: np.ndarray,
) -> tuple[float, float, float]:  # fmt: skip
    """cos(E G_hat, E G_ref) over checkpoints (each: ``est`` (repeats, K)) from the folds'
    independent means, <m_f, m'_h> for f != h (module docstring), with a jackknife interval
    over blocks of repeats."""
    folds = int(fold.max()) + 1
    if folds < 2:
        return math.nan, math.nan, math.nan
    block = (np.arange(fold.size) // folds) % JACKKNIFE_BLOCKS
    pairs = [(f, h) for f in range(folds) for h in range(folds) if f != h]

    def cos(keep: np.ndarray) -> float:
        sums = np.zeros(3)  # <a, r>, ||a||^2, ||r||^2
        for a, r in zip(arm, ref, strict=True):
            ma = [a["est"][keep & (fold == f)].mean(axis=0) for f in range(folds)]
            mr = [r["est"][keep & (fold == f)].mean(axis=0) for f in range(folds)]
            sums += np.mean(
                [(ma[f] @ mr[h], ma[f] @ ma[h], mr[f] @ mr[h]) for f, h in pairs], axis=0
            )
        return float(sums[0] / math.sqrt(sums[1] * sums[2])) if min(sums[1:]) > 0 else math.nan

    whole = cos(np.ones(fold.size, dtype=bool))
    drops = np.array([cos(block != b) for b in range(JACKKNIFE_BLOCKS)])
    if not np.isfinite(whole) or not np.isfinite(drops).all():
        return whole, math.nan, math.nan
    n = JACKKNIFE_BLOCKS
    se = math.sqrt((n - 1) / n * ((drops - drops.mean()) ** 2).sum())
    return whole, whole - Z_95 * se, whole + Z_95 * se
