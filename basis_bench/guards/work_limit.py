"""The work a replay is asked for, bounded before it starts: a count flag (``--repeats
10**12``) that fits in memory ran without end. A replay's work is counted in rollout draws
(repeats x checkpoints x prompts a batch x rollouts a prompt x estimators), and a run of
more than :data:`MAX_DRAWS` is refused in one line naming the count that fits and how to
lift the limit (the environment variable :data:`ENV`)."""

from __future__ import annotations

import os

from basis_bench.errors import InputError

MAX_DRAWS = 10**11
"""The documented limit: about 28 hours at the rate below (the default ``evaluate
--estimators all`` run draws 1.8e7)."""
DRAWS_PER_SECOND = 10**6
"""``evaluate --estimators all --repeats 200 --no-trajectory`` on the shipped data, 2 shared
cores, Dec 2026: 3.7e6 draws in 3.0 s wall (1.2e6 a second); rounded down."""
ENV = "BASIS_BENCH_MAX_DRAWS"


def max_draws() -> int | None:
    """The limit in force: :data:`ENV` when set (0: none), else :data:`MAX_DRAWS`."""
    given = os.environ.get(ENV, "").strip()
    if not given:
        return MAX_DRAWS
    if not given.isdigit():
        raise InputError(
            f"{ENV} must be a whole number of rollout draws (0: no limit), got {given!r}"
        )
    return int(given) or None


def _count(n: int) -> str:
    text = f"{n:,}"
    return text if len(text) <= 20 else f"about 10^{len(str(n)) - 1}"


def check_draws(what: str, name: str, value: int, draws_each: int) -> None:
    """Refuse, before it starts, ``what`` whose count ``name`` = ``value`` makes more rollout
    draws than :func:`max_draws` at ``draws_each`` draws a unit of it (counted in Python's
    integers: a count of 10^30 never overflows)."""
    limit = max_draws()
    draws = value * max(draws_each, 1)
    if limit is None or draws <= limit:
        return
    fits = limit // max(draws_each, 1)
    hours = limit / DRAWS_PER_SECOND / 3600
    fix = f"{name} at most {fits:,} fits" if fits >= 1 else f"lower {name}"
    raise InputError(
        f"{what} draws {_count(draws)} rollouts ({name} {_count(value)}): more than the "
        f"limit of {_count(limit)} (about {hours:,.0f} hours at 10^6 draws a second); {fix}, "
        f"or set {ENV} to a higher limit (0: none)"
    )
