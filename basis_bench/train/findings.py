"""The paper's three training findings (Section 5.2), judged from a study's arms by written
rules (when each was fixed: :data:`WHEN_FIXED`).

Arms are recognised by their configuration: BASIS (``basis``, one rollout per prompt),
GRPO-type (``grpo``, G > 1), vanilla (``vanilla``) and REINFORCE++ (``reinforce_pp``). Two
arms are compared only when they share every setting but the estimator's own (estimator,
its options, G, advantage normalisation) and ``steps``. A comparison pairs their finished
runs by seed (a seed draws the same prompts and first rollouts in every arm), d_s = x_s -
y_s, and takes the 95% Student-t interval [lo, hi] of the mean of d over the n shared seeds
(:func:`summary.mean_interval`). "Half" is BASIS's held-out accuracy at the last evaluation
at or before half the other arm's steps (the paper trains BASIS 150 steps against 300);
"final" is the other arm's last evaluation. With M = :data:`MARGIN`:

1. *BASIS, trained half the steps, is competitive with G = 8*: d = BASIS half - GRPO final.
   Reproduced when lo > -M (no worse than M, non-inferiority), not reproduced when hi < -M,
   else not resolvable.
2. *BASIS, trained half the steps, beats single-rollout vanilla and REINFORCE++*: d = BASIS
   half - the other's final. Reproduced when lo > 0; else not reproduced when hi < M (a gain of M
   or more is ruled out); else not resolvable.
3. *Vanilla collapses, BASIS does not*, each over its own full run (collapsed:
   :func:`summary.collapsed`): an arm collapses when at least two thirds of the shared finished
   seeds collapse and is stable when none does. Reproduced when vanilla collapses and BASIS is
   stable; not reproduced when BASIS collapses; else not resolvable. The interval shown is that
   of vanilla's decline - BASIS's decline, for information.

Before those rules, over the seeds both arms finished (at least :data:`MIN_SEEDS`), two say
when the comparison cannot speak to the finding, with the reason:

- **not testable here**: both arms collapsed in every seed (the rate fails every arm: the
  difference is one between two failed runs); for finding 3 also when vanilla collapsed in no
  seed (there is no collapse for BASIS to prevent).
- **confounded** (findings 1 and 2): the comparison arm collapsed in every seed and BASIS did
  not, and the paper does not claim that arm collapses (every arm but vanilla, whose collapse
  is finding 3's claim): a difference in BASIS's favour then measures that arm's failure in
  this setting, not BASIS. The reason gives each seed's truncated share at collapse (the
  share of responses cut at ``max_new_tokens`` from the step of the third-last evaluation on).

Fewer than :data:`MIN_SEEDS` shared seeds: not resolvable, whatever the numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.train.summary import (
    Arm,
    collapsed,
    evaluations,
    mean_interval,
    run_metrics,
    setting_differences,
)

MARGIN = 0.05  # held-out accuracy: what "competitive" allows, what a "gain" must exceed
MIN_SEEDS = 3  # the study's minimum; fewer shared seeds decide nothing
# The settings in which two arms of one study differ by design.
ARM_KEYS = frozenset({"estimator", "estimator_options", "group_size", "advantage_norm", "steps"})

REPRODUCED, NOT_REPRODUCED, OPEN = "reproduced", "not reproduced", "not resolvable"
CONFOUNDED, UNTESTABLE = "confounded", "not testable here"
WHEN_FIXED = (
    "The interval rules (M, each finding's bounds, 3 seeds) were fixed on 5 Dec 2026 "
    "(commit 2aaeaa0) after seed 0 of vanilla, REINFORCE++ and GRPO(8) at lr 5e-5 had "
    "finished, before any other run of the study finished; the collapse rule and the labels "
    "confounded and not testable here on 6 Dec 2026 (issue 42), after every run of seeds 0-2 "
    "(chosen knowing them), before seeds 3-5 were committed."
)


@dataclass(frozen=True)
class Finding:
    """One comparison's verdict and the numbers that decide it."""

    finding: int
    claim: str
    comparison: str
    seeds: int
    mean: float  # mean of the paired differences (NaN: no shared finished seed)
    low: float  # its 95% t-interval (NaN below two seeds)
    high: float
    collapsed: str  # each arm's collapsed seeds, "BASIS k/n, GRPO (G=8) k/n"
    verdict: str
    reason: str  # why, for confounded and not testable here; else empty


def role(config: dict[str, Any]) -> str | None:
    """``basis``, ``grpo``, ``vanilla``, ``reinforce_pp`` or None (not one of the paper's arms)."""
    from basis_bench.estimators import get

    estimator = config.get("estimator")
    try:
        group = get(str(estimator)).rollouts_per_prompt(int(config.get("group_size", 1)))
    except InputError:
        return None
    if estimator == "basis" and group == 1:
        return "basis"
    if estimator == "grpo" and group > 1:
        return "grpo"
    return str(estimator) if estimator in ("vanilla", "reinforce_pp") else None


RunValue = Callable[[dict[str, Any], pl.DataFrame], float]


def _evals(log: pl.DataFrame, until: int) -> np.ndarray:
    """The held-out accuracies logged at or before step ``until``, in step order."""
    evals = log.filter(pl.col("eval_accuracy").is_not_null() & (pl.col("step") <= until))
    return evals.sort("step")["eval_accuracy"].to_numpy()


def _finished(config: dict[str, Any], log: pl.DataFrame, step: int | None = None) -> bool:
    wanted = int(config.get("steps", 0)) if step is None else step
    return int(log["step"].max()) >= wanted  # type: ignore[arg-type]


def of_finished(metric: str) -> RunValue:
    """:func:`summary.run_metrics`' ``metric`` of a finished run (NaN while it runs)."""

    def value(config: dict[str, Any], log: pl.DataFrame) -> float:
        return run_metrics(config, log)[metric] if _finished(config, log) else math.nan

    return value


final, decline = of_finished("final"), of_finished("decline")


def collapse(config: dict[str, Any], log: pl.DataFrame) -> float:
    """1.0 when a finished run collapsed (:func:`summary.collapsed`), else 0.0 (NaN while it runs)."""
    return float(collapsed(evaluations(log)[1])) if _finished(config, log) else math.nan


def truncated_at_collapse(config: dict[str, Any], log: pl.DataFrame) -> float:
    """The mean ``truncated_share`` from the step of the run's third-last evaluation on."""
    steps, _ = evaluations(log)
    since = int(steps[-3]) if steps.size >= 3 else 0
    share = log.filter(pl.col("step") >= since)["truncated_share"].drop_nulls()
    return float(share.mean()) if share.len() else math.nan  # type: ignore[arg-type]


def accuracy_at(step: int) -> RunValue:
    """The last evaluation at or before ``step`` of a run that reached it (else NaN)."""

    def value(config: dict[str, Any], log: pl.DataFrame) -> float:
        accuracy = _evals(log, step)
        return float(accuracy[-1]) if _finished(config, log, step) and accuracy.size else math.nan

    return value


def by_seed(arm: Arm, value: RunValue) -> dict[int, float]:
    """``value`` of each of the arm's runs, by seed, where it is a number."""
    values = {int(config.get("seed", 0)): value(config, log) for _, config, log in arm.runs}
    return {seed: v for seed, v in values.items() if not math.isnan(v)}


def paired(x: dict[int, float], y: dict[int, float]) -> tuple[int, float, float, float]:
    """n shared seeds, the mean of x_s - y_s and its 95% t-interval (low, high)."""
    seeds = sorted(set(x) & set(y))
    mean, half = mean_interval([x[s] - y[s] for s in seeds])
    return len(seeds), mean, mean - half, mean + half


def non_inferior(n: int, low: float, high: float) -> str:
    """Finding 1's rule: the difference is no worse than -MARGIN."""
    if n < MIN_SEEDS:
        return OPEN
    return REPRODUCED if low > -MARGIN else NOT_REPRODUCED if high < -MARGIN else OPEN


def superior(n: int, low: float, high: float) -> str:
    """Finding 2's rule: the difference is above 0; a gain of MARGIN or more ruled out refutes it."""
    if n < MIN_SEEDS:
        return OPEN
    return REPRODUCED if low > 0 else NOT_REPRODUCED if high < MARGIN else OPEN


def collapse_state(collapsed: Sequence[bool]) -> str:
    """``collapses`` (at least two thirds of the seeds), ``stable`` (none) or ``mixed``."""
    count = sum(collapsed)
    if count == 0:
        return "stable"
    return "collapses" if 3 * count >= 2 * len(collapsed) else "mixed"


def collapse_verdict(vanilla: Sequence[bool], basis: Sequence[bool]) -> str:
    """Finding 3's rule on the finished seeds' collapse flags of the two arms, once
    :func:`untestable` has passed them."""
    if min(len(vanilla), len(basis)) < MIN_SEEDS:
        return OPEN
    v, b = collapse_state(vanilla), collapse_state(basis)
    if v == "collapses" and b == "stable":
        return REPRODUCED
    return NOT_REPRODUCED if b == "collapses" else OPEN


def untestable(
    first: Sequence[bool], second: Sequence[bool], names: tuple[str, str], finding: int
) -> str:
    """Why the comparison cannot test the finding ("" when it can): both arms collapsed in
    every seed; or, for finding 3 (``first`` vanilla), vanilla collapsed in none."""
    n = len(first)
    if n < MIN_SEEDS:
        return ""
    if all(first) and all(second):
        return f"{names[0]} and {names[1]} collapsed in every seed ({n}/{n}): the rate fails both"
    if finding == 3 and not any(first):
        return (
            f"{names[0]} collapsed in no seed (0/{n}; {names[1]} {sum(second)}/{n}): "
            "no collapse for BASIS to prevent at this rate"
        )
    return ""


def confounded(
    basis: Sequence[bool], rival: Sequence[bool], rival_role: str, name: str, shares: list[float]
) -> str:
    """Why the comparison is confounded ("" when not): the rival, an arm the paper does not
    say collapses (not vanilla), collapsed in every seed and BASIS did not."""
    n = len(rival)
    if n < MIN_SEEDS or rival_role == "vanilla" or not all(rival) or all(basis):
        return ""
    truncated = ", ".join(f"{s:.2f}" for s in shares)
    return (
        f"{name} collapsed in {n}/{n} seeds (truncated share at collapse {truncated}), "
        f"BASIS in {sum(basis)}/{n}: the finding measures that arm's failure at this setting"
    )


def _pairs(arms: Sequence[Arm], labels: Sequence[str], x: str, y: str) -> Iterator[tuple]:
    """(x arm, its label, y arm, its label) for every comparable pair of the two roles."""
    roles = [role(a.config) for a in arms]
    for a, la, ra in zip(arms, labels, roles, strict=True):
        for b, lb, rb in zip(arms, labels, roles, strict=True):
            if (ra, rb) == (x, y) and not setting_differences(a.config, b.config, ARM_KEYS):
                yield a, la, b, lb


def _flags(first: Arm, second: Arm) -> tuple[list[int], list[bool], list[bool]]:
    """The seeds both arms finished and each arm's collapse flags on them."""
    x, y = by_seed(first, collapse), by_seed(second, collapse)
    seeds = sorted(set(x) & set(y))
    return seeds, [bool(x[s]) for s in seeds], [bool(y[s]) for s in seeds]


def judge(arms: Sequence[Arm], labels: Sequence[str]) -> list[Finding]:
    """Every finding whose arms are among ``arms`` (none: an empty list)."""
    found = []
    claims = {
        1: "BASIS, trained half the steps, is competitive with GRPO-type G = 8",
        2: "BASIS, trained half the steps, beats single-rollout baselines",
        3: "vanilla G = 1 collapses, BASIS does not",
    }
    for other, number, rule in (
        ("grpo", 1, non_inferior),
        ("vanilla", 2, superior),
        ("reinforce_pp", 2, superior),
    ):
        for basis, name, rival, rival_name in _pairs(arms, labels, "basis", other):
            half = int(rival.config.get("steps", 0)) // 2
            n, mean, low, high = paired(by_seed(basis, accuracy_at(half)), by_seed(rival, final))
            comparison = f"{name} acc. at step {half} - {rival_name} final acc."
            seeds, b_flags, r_flags = _flags(basis, rival)
            shares = by_seed(rival, truncated_at_collapse)
            verdict, reason = UNTESTABLE, untestable(b_flags, r_flags, (name, rival_name), number)
            if not reason:
                truncated = [shares.get(s, math.nan) for s in seeds]
                reason = confounded(b_flags, r_flags, other, rival_name, truncated)
                verdict = CONFOUNDED if reason else rule(n, low, high)
            counts = _counts((name, b_flags), (rival_name, r_flags))
            found.append(
                Finding(
                    number, claims[number], comparison, n, mean, low, high, counts, verdict, reason
                )
            )
    for vanilla, v_name, basis, b_name in _pairs(arms, labels, "vanilla", "basis"):
        n, mean, low, high = paired(by_seed(vanilla, decline), by_seed(basis, decline))
        _, v_flags, b_flags = _flags(vanilla, basis)
        reason = untestable(v_flags, b_flags, (v_name, b_name), 3)
        comparison = f"{v_name} decline - {b_name} decline"
        verdict = UNTESTABLE if reason else collapse_verdict(v_flags, b_flags)
        counts = _counts((v_name, v_flags), (b_name, b_flags))
        found.append(Finding(3, claims[3], comparison, n, mean, low, high, counts, verdict, reason))
    return sorted(found, key=lambda f: f.finding)


def _counts(*arms: tuple[str, Sequence[bool]]) -> str:
    return ", ".join(f"{name} {sum(flags)}/{len(flags)}" for name, flags in arms)


def findings_frame(found: Sequence[Finding]) -> pl.DataFrame:
    """The findings as a table, one row each (NaN as null)."""
    rows = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(f).items()}
        for f in found
    ]
    schema = {"finding": pl.Int64, "seeds": pl.Int64, "mean": pl.Float64}
    schema |= {"low": pl.Float64, "high": pl.Float64}
    return pl.DataFrame(rows, schema_overrides=schema)


def markdown(found: Sequence[Finding]) -> str:
    """The findings as markdown, with the rules that decided them and when they were fixed."""
    lines = [
        "| finding | the paper's claim | paired difference (by seed) | seeds | mean [95% CI] "
        "| collapsed | verdict | why |",
        "| --- " * 8 + "|",
    ]
    for f in found:
        interval = "–" if math.isnan(f.mean) else f"{f.mean:+.3f}"
        if not math.isnan(f.low):
            interval += f" [{f.low:+.3f}, {f.high:+.3f}]"
        lines.append(
            f"| {f.finding} | {f.claim} | {f.comparison} | {f.seeds} | {interval} "
            f"| {f.collapsed or '–'} | **{f.verdict}** | {f.reason or '–'} |"
        )
    rules = (
        f"Rules (M = {MARGIN}, at least {MIN_SEEDS} shared finished seeds, else not resolvable; "
        "basis_bench/train/findings.py): not testable here when both arms collapsed in every "
        "seed, or, for 3, vanilla in none; confounded (1, 2) when the comparison arm, one the "
        "paper does not say collapses, collapsed in every seed and BASIS did not; else 1 "
        "reproduced when the interval's low end > -M, not when its high end < -M; 2 "
        "reproduced when low > 0, not when high < M; 3 reproduced when vanilla collapses (in "
        "at least two thirds of its seeds) and BASIS in none, not when BASIS collapses in two "
        "thirds; otherwise not resolvable. A run collapsed when the mean of its last three "
        "held-out evaluations fell below its start or a three-evaluation window by more than "
        "binomial noise allows at 5% (and by at least 0.1; basis_bench/train/summary.py)."
    )
    return "\n".join(lines) + "\n\n" + rules + "\n\n" + WHEN_FIXED + "\n"


def write_findings(arms: Sequence[Arm], labels: Sequence[str], out: Path) -> list[Path]:
    """``training_findings.csv`` and ``.md`` in ``out`` when some finding's arms are given."""
    from basis_bench.guards.outputs import atomic_write, write_text_atomic

    found = judge(arms, labels)
    if not found:
        return []
    with atomic_write(out / "training_findings.csv") as tmp:
        findings_frame(found).write_csv(tmp)
    write_text_atomic(out / "training_findings.md", markdown(found))
    return [out / "training_findings.csv", out / "training_findings.md"]
