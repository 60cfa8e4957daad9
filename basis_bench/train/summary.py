"""Several seeds of one arm, summarised: per-run numbers, then their mean and a Student-t
95% confidence interval over seeds.

An **arm** is one configuration trained with several seeds: a folder of ``seed-S`` runs
(what ``basis-bench train --seeds`` writes) or a single run. Its runs must agree in every
setting but ``seed`` and ``run_dir``.

One run's numbers (held-out greedy accuracy at the evaluations of its log):

==============  ===========================================================================
final           accuracy at the last evaluation
peak            the highest accuracy over all evaluations, step 0 included
drop            peak - final
decline         how far the last three evaluations' mean fell below the run's best level
                (:func:`decline`; the collapse rule, :func:`collapsed`, tests it against
                the held-out set's binomial noise)
dip             the largest fall below the best accuracy so far, at any evaluation:
                max_t (max_{s <= t} acc_s - acc_t) >= drop; it also sees a collapse the
                run recovered from (reported, not part of the collapse rule)
half            accuracy at the last evaluation at or before step ``steps // 2`` (the
                paper's BASIS arm trains half the steps: its half-budget point is read off
                the same run); none while the run has not reached that step
rollouts        rollouts sampled in the run's steps (the reference cache not counted)
wall_hours      the logged phases' seconds (sample, reward, estimate, update, sync, eval,
                checkpoint), in hours; model loading, the reference cache and the value
                probe (which only observes the run) not counted
value_error     the mean of the run's value-probe records' noise-corrected squared error
                of the baseline (:mod:`basis_bench.train.probe`, step 0 included); none
                for a run without probe records
==============  ===========================================================================

Over the n seeds of an arm: mean +- t_{0.975, n-1} s / sqrt(n), s the sample standard
deviation (no interval for one seed), over the seeds that have the number.

**The collapse rule** (issue 42; it replaced "final at least 0.15 below peak", which binomial
noise alone trips in 8-14% of stable runs at 100 held-out prompts and 13 evaluations). Of a
run's m held-out accuracies a_0..a_{m-1} on n prompts, L = the mean of the last
:data:`WINDOW` = 3; the *levels* are a_0 alone (the policy before training) and the mean of
every other run of 3 consecutive evaluations, K = m - 2 levels in all; ``decline`` = max(0,
max over levels (level - L)). The run **collapsed** when some level of k evaluations is above L by at
least

    max(MIN_DECLINE, z_{1 - ALPHA/K} * 0.5 * sqrt((1/k + 1/3) / n)),

a one-sided z test of "level > L" under binomial noise at its worst (p = 1/2), Bonferroni-
corrected over the K levels, so a stable run is called collapsed at most ALPHA = 5% of the
time (measured by Monte Carlo in tests/test_collapse_rule.py: at most 2.8% at n = 100, 13
evaluations, true accuracy 0.1 to 0.9), and a fall of 0.2 (at the last three evaluations,
or spread over the second half) is caught in over 99% of runs. At the study's n = 100 and
m = 13 the bar is 0.107 for a window and 0.151 for a_0. n is read back from the accuracies
(:func:`heldout_size`). Fewer than 4 evaluations: no decline, not collapsed.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.train.config import OBSERVATIONAL_KEYS
from basis_bench.train.loop import read_log

WINDOW = 3  # held-out evaluations averaged into one level of the collapse rule
ALPHA = 0.05  # the collapse rule's false-positive rate on a stable run, at most
MIN_DECLINE = 0.10  # and the least fall it calls a collapse, however large n
MAX_HELDOUT = 10_000  # the largest held-out size heldout_size reads back
METRICS = (
    "final", "peak", "drop", "decline", "dip", "half", "rollouts", "wall_hours", "value_error",
)  # fmt: skip
VALUE_ERROR = "probe_value_error"  # the log's column that value_error averages
# the training entropy and the held-out evaluation's policy measures (train/policy_measures.py)
POLICY_MEASURES = ("entropy", "eval_strict_accuracy", "eval_format_share",
                   "eval_truncated_share", "eval_answer_diversity")  # fmt: skip
UNTIMED_PHASES = frozenset({"probe"})  # logged seconds that wall_hours leaves out
SEED_PREFIX = "seed-"
# Settings that differ between the seeds of one arm by design.
PER_SEED_KEYS = frozenset({"seed", "run_dir", "provenance"})


def setting_differences(
    a: dict[str, Any], b: dict[str, Any], also: frozenset[str] = frozenset()
) -> list[str]:
    """The settings (sorted) in which two run configs differ, leaving out the per-seed and
    observational ones and ``also``: what makes two runs of one arm different runs."""
    keys = (set(a) | set(b)) - PER_SEED_KEYS - OBSERVATIONAL_KEYS - also
    return sorted(k for k in keys if a.get(k) != b.get(k))


def heldout_size(accuracy: Sequence[float] | np.ndarray) -> int:
    """n of accuracies that are shares k/n of n prompts: their least common denominator
    (each read as a fraction of denominator <= MAX_HELDOUT; at most MAX_HELDOUT). It is n
    itself unless every accuracy shares a factor with n, and never above it, so the noise
    it implies is never understated."""
    n = 1
    for a in accuracy:
        n = math.lcm(n, Fraction(float(a)).limit_denominator(MAX_HELDOUT).denominator)
    return min(n, MAX_HELDOUT)


def _levels(accuracy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The collapse rule's levels (a_0, then every window of WINDOW evaluations but the
    last) and how many evaluations each averages."""
    windows = np.convolve(accuracy, np.ones(WINDOW) / WINDOW, mode="valid")[:-1]
    return np.concatenate([accuracy[:1], windows]), np.array([1] + [WINDOW] * windows.size)


def decline(accuracy: Sequence[float] | np.ndarray) -> float:
    """max(0, max over levels (level - mean of the last WINDOW evaluations)); NaN with fewer
    than WINDOW + 1 evaluations."""
    accuracy = np.asarray(accuracy, dtype=np.float64)
    if accuracy.size <= WINDOW:
        return math.nan
    levels, _ = _levels(accuracy)
    return max(0.0, round(float(levels.max() - accuracy[-WINDOW:].mean()), 9))


def collapsed(accuracy: Sequence[float] | np.ndarray) -> bool:
    """The collapse rule (the module's docstring): some level is above the last WINDOW
    evaluations' mean by max(MIN_DECLINE, z_{1 - ALPHA/K} * 0.5 * sqrt((1/k + 1/WINDOW) / n))."""
    accuracy = np.asarray(accuracy, dtype=np.float64)
    if accuracy.size <= WINDOW:
        return False
    levels, counts = _levels(accuracy)
    z = NormalDist().inv_cdf(1 - ALPHA / levels.size)
    noise = 0.5 * np.sqrt((1 / counts + 1 / WINDOW) / heldout_size(accuracy))
    falls = np.round(levels - accuracy[-WINDOW:].mean(), 9)
    return bool((falls >= np.maximum(MIN_DECLINE, z * noise)).any())


RunLog = tuple[Path, dict[str, Any], pl.DataFrame]  # directory, config, log


def load_run(run_dir: str | os.PathLike[str]) -> tuple[dict[str, Any], pl.DataFrame]:
    """A run's configuration and its log as a frame (one row per step record)."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise InputError(f"{run_dir}: no config.json; is this a training run directory?")
    try:
        config = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a JSON configuration ({err})") from err
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a JSON configuration (a {type(config).__name__})")
    for key, kind in (("estimator", str), ("group_size", int), ("loss", str)):
        if not isinstance(config.get(key), kind) or isinstance(config.get(key), bool):
            raise InputError(f"{path}: {key!r} is missing or not a {kind.__name__}")
    columns = ("step", "mean_reward", "truncated_share", "eval_accuracy", "beta", "rollouts",
               VALUE_ERROR, *POLICY_MEASURES)  # fmt: skip
    rows = [{c: r.get(c) for c in columns} | {"seconds": _seconds(r)} for r in read_log(run_dir)]
    if not rows:
        raise InputError(f"{run_dir}: log.jsonl is empty")
    for number, row in enumerate(rows, start=1):
        for column, value in row.items():
            wanted = int if column == "step" else (int, float)
            if (value is not None or column == "step") and (
                isinstance(value, bool) or not isinstance(value, wanted)
            ):
                raise InputError(
                    f"{run_dir}: step record {number} of log.jsonl: {column!r} is {value!r}, "
                    "not a number"
                )
        step = int(row["step"] or 0)  # an int: checked above
        if not 0 <= step < 2**63:  # 10^20 was a polars overflow traceback
            raise InputError(
                f"{run_dir}: step record {number} of log.jsonl: 'step' is {step}, not a step number"
            )
    schema = {
        "step": pl.Int64,
        "mean_reward": pl.Float64,
        "truncated_share": pl.Float64,
        "eval_accuracy": pl.Float64,
        "beta": pl.Float64,
        "rollouts": pl.Int64,
        VALUE_ERROR: pl.Float64,
        **dict.fromkeys(POLICY_MEASURES, pl.Float64),
        "seconds": pl.Float64,
    }
    return config, pl.DataFrame(rows, schema=schema, orient="row")


def _seconds(record: dict[str, Any]) -> Any:
    """A record's logged phases' seconds, summed, but for :data:`UNTIMED_PHASES` (None when
    the record has none; a malformed entry is returned as it is, for load_run's check to
    refuse)."""
    phases = record.get("seconds")
    if phases is None:
        return None
    if not isinstance(phases, dict):
        return phases
    values = [v for phase, v in phases.items() if phase not in UNTIMED_PHASES]
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        return phases
    return float(sum(values))


def t_quantile(p: float, df: int) -> float:
    """q with P(T <= q) = p for Student's t with ``df`` degrees of freedom, 0.5 < p < 1.

    The density c (1 + x^2/df)^(-(df+1)/2) integrated on [0, 400] by the trapezoid rule
    (step 1e-3) and inverted by interpolation: within 1e-4 of the tables for df >= 1.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1; got p={p}, df={df}")
    x = np.linspace(0.0, 400.0, 400_001)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_c - (df + 1) / 2 * np.log1p(x * x / df))
    steps = (density[1:] + density[:-1]) * (x[1] - x[0]) / 2
    upper = np.concatenate([[0.0], np.cumsum(steps)])  # P(0 <= T <= x)
    return float(np.interp(p - 0.5, upper, x))


def mean_interval(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval) of the finite values; half-width NaN for
    fewer than two, mean NaN for none."""
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    n = finite.size
    if n == 0:
        return math.nan, math.nan
    if n == 1:
        return float(finite[0]), math.nan
    half = t_quantile(0.975, n - 1) * float(finite.std(ddof=1)) / math.sqrt(n)
    return float(finite.mean()), half


@dataclass(frozen=True)
class Arm:
    """One configuration's runs (its seeds), drawn and summarised together."""

    path: Path  # the arm's folder, or the run itself when it has no seed-S runs
    runs: tuple[RunLog, ...]

    @property
    def config(self) -> dict[str, Any]:
        return self.runs[0][1]


def seed_runs(path: str | os.PathLike[str]) -> list[Path]:
    """The ``seed-S`` runs in an arm's folder (by seed), or ``[path]`` for a single run."""
    path = Path(path)
    found = [p for p in path.glob(f"{SEED_PREFIX}*") if (p / "log.jsonl").is_file()]
    if not found:
        return [path]
    return sorted(found, key=lambda p: (len(p.name), p.name))


def load_arm(path: str | os.PathLike[str]) -> Arm:
    """An arm's runs; :class:`InputError` when they differ in a setting other than the seed
    (or an observational one: the value probe's)."""
    runs = tuple((p, *load_run(p)) for p in seed_runs(path))
    first_dir, first, _ = runs[0]
    for run_dir, config, _ in runs[1:]:
        differ = setting_differences(first, config)
        if differ:
            key = differ[0]
            raise InputError(
                f"{path}: runs {first_dir.name} and {run_dir.name} differ in {key} "
                f"({first.get(key)!r} vs {config.get(key)!r}); the seeds of one arm share "
                "every setting but the seed"
            )
    return Arm(Path(path), runs)


def step_bands(arm: Arm, column: str, smooth: int = 1) -> pl.DataFrame:
    """Per step: the mean of ``column`` over the arm's runs that logged it (each run's
    rolling mean of ``smooth`` records first), its 95% t half-width (null below two runs)
    and the number of runs n."""
    frames = [
        log.filter(pl.col(column).is_not_null())
        .sort("step")
        .select("step", pl.col(column).rolling_mean(smooth, min_samples=1).alias("value"))
        for _, _, log in arm.runs
    ]
    table = (
        pl.concat(frames)
        .group_by("step")
        .agg(pl.col("value").mean().alias("mean"), pl.col("value").std().alias("std"), pl.len())
        .sort("step")
    )
    quantile = {n: t_quantile(0.975, n - 1) for n in set(table["len"].to_list()) if n > 1}
    half = [
        quantile[n] * s / math.sqrt(n) if n > 1 else None
        for n, s in zip(table["len"].to_list(), table["std"].to_list(), strict=True)
    ]
    return table.select("step", "mean", pl.Series("ci95", half, dtype=pl.Float64), n="len")


def evaluations(log: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """A run's evaluated steps and their held-out accuracies, in step order."""
    evals = log.filter(pl.col("eval_accuracy").is_not_null()).sort("step")
    return evals["step"].to_numpy(), evals["eval_accuracy"].to_numpy()


def run_metrics(config: dict[str, Any], log: pl.DataFrame) -> dict[str, float]:
    """One run's :data:`METRICS` (NaN where the run has no evaluation to read them from)."""
    steps, accuracy = evaluations(log)
    half = int(config.get("steps", 0)) // 2
    reached = int(log["step"].to_numpy().max()) >= half
    at_half = accuracy[steps <= half] if reached else accuracy[:0]
    final = float(accuracy[-1]) if accuracy.size else math.nan
    peak = float(accuracy.max()) if accuracy.size else math.nan
    best_so_far = np.maximum.accumulate(accuracy)
    dip = float((best_so_far - accuracy).max()) if accuracy.size else math.nan
    errors = log[VALUE_ERROR].drop_nulls().to_numpy()
    return {
        "final": final,
        "peak": peak,
        "drop": peak - final,
        "decline": decline(accuracy),
        "dip": dip,
        "half": float(at_half[-1]) if at_half.size else math.nan,
        "rollouts": float(log["rollouts"].fill_null(0).sum()),
        "wall_hours": float(log["seconds"].fill_null(0.0).sum()) / 3600,
        "value_error": float(errors.mean()) if errors.size else math.nan,
    }


def runs_table(arms: Sequence[Arm], labels: Sequence[str]) -> pl.DataFrame:
    """One row per run: arm, label, run, seed, last_step, :data:`METRICS`, collapsed."""
    rows = []
    for arm, label in zip(arms, labels, strict=True):
        for run_dir, config, log in arm.runs:
            metrics = run_metrics(config, log)
            rows.append(
                {
                    "arm": str(arm.path),
                    "label": label,
                    "run": str(run_dir),
                    "seed": int(config.get("seed", 0)),
                    "last_step": int(log["step"].to_numpy().max()),
                    **metrics,
                    "collapsed": collapsed(evaluations(log)[1]),
                }
            )
    return pl.DataFrame(rows)


def arms_table(runs: pl.DataFrame) -> pl.DataFrame:
    """One row per arm: seeds, the shortest run's last step, each metric's mean and 95%
    half-width over seeds (``*_ci95``, null for one seed), and how many seeds collapsed."""
    rows = []
    for (arm, label), group in runs.group_by("arm", "label", maintain_order=True):
        row: dict[str, Any] = {
            "arm": arm,
            "label": label,
            "seeds": group.height,
            "last_step": int(group["last_step"].to_numpy().min()),
        }
        for metric in METRICS:
            mean, half = mean_interval(group[metric].to_numpy())
            row[metric] = None if math.isnan(mean) else mean
            row[f"{metric}_ci95"] = None if math.isnan(half) else half
        row["collapsed"] = int(group["collapsed"].sum())
        rows.append(row)
    return pl.DataFrame(rows)


DIGITS = {"rollouts": 0, "value_error": 4}  # decimals in the markdown table (else 3)


def markdown_table(arms: pl.DataFrame) -> str:
    """The arms table as markdown, each metric as ``mean ± half-width``."""
    heads = {
        "final": "final acc.",
        "peak": "peak acc.",
        "drop": "peak - final",
        "decline": "decline",
        "dip": "largest dip",
        "half": "acc. at half budget",
        "rollouts": "rollouts",
        "wall_hours": "wall hours",
        "value_error": "value error",
    }
    lines = [
        "| arm | seeds | steps | " + " | ".join(heads.values()) + " | collapsed |",
        "| --- " * (len(heads) + 4) + "|",
    ]
    for row in arms.iter_rows(named=True):
        cells = [_cell(row[m], row[f"{m}_ci95"], DIGITS.get(m, 3)) for m in heads]
        lines.append(
            f"| {row['label']} | {row['seeds']} | {row['last_step']} | "
            + " | ".join(cells)
            + f" | {row['collapsed']}/{row['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def _cell(mean: float | None, half: float | None, digits: int) -> str:
    if mean is None:
        return "–"
    text = f"{mean:.{digits}f}"
    return text if half is None else f"{text} ± {half:.{digits}f}"


def write_tables(arms: Sequence[Arm], labels: Sequence[str], out: Path) -> list[Path]:
    """``training_runs.csv`` (per run), ``training_table.csv`` and ``training_table.md``
    (per arm, with intervals) in ``out``."""
    from basis_bench.guards.outputs import atomic_write, write_text_atomic

    runs = runs_table(arms, labels)
    table = arms_table(runs)
    written = []
    for name, frame in (("training_runs.csv", runs), ("training_table.csv", table)):
        with atomic_write(out / name) as tmp:
            frame.write_csv(tmp)
        written.append(out / name)
    write_text_atomic(out / "training_table.md", markdown_table(table))
    return [*written, out / "training_table.md"]
