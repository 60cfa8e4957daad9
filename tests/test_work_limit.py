"""A count that fits in memory but not in any sensible time (``--repeats 10**12`` ran
without end) is refused before the replay starts, in one line naming the count that fits
and how to lift the limit; the limit's arithmetic is exact at its edge."""

from __future__ import annotations

import subprocess

import pytest
from conftest import CLI, ONE_THREAD, assert_one_line_error

import basis_bench
from basis_bench.errors import InputError
from basis_bench.guards.work_limit import ENV, MAX_DRAWS, check_draws, max_draws


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own: before the limit it never ended (timeout)."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=240, env={**ONE_THREAD, **env}
    )


@pytest.mark.parametrize(
    ("args", "limit", "needle"),
    [
        (["evaluate", "--repeats", str(10**12)], "", "this evaluate run draws about 10^"),
        (["sensitivity", "--repeats", str(10**12)], "", "this sensitivity sweep draws about 10^"),
        (
            ["evaluate", "--trajectory-schedule", "epochs", "--trajectory-epochs", "1000"],
            str(10**9),
            "this trajectory replay draws",
        ),
    ],
)
def test_a_count_past_the_limit_is_one_line_before_anything_is_written(
    tmp_path, args, limit, needle
):
    """--repeats 10**12 fits in memory (the one-step replay streams its repeats) and ran
    without end; 1,000 epochs fit in memory too (the epoch replay's limit is lowered here:
    at the default one they are hours of work, not days)."""
    out = tmp_path / "out"
    result = run([*args, "--out", str(out)], **({ENV: limit} if limit else {}))
    flag = args[-2]
    assert_one_line_error(result, needle, f"{flag} at most", f"set {ENV} to a higher limit")
    assert not out.exists()


def test_the_notebook_api_refuses_by_the_argument_name():
    with pytest.raises(InputError, match=r"repeats at most [\d,]+ fits") as err:
        basis_bench.evaluate(repeats=10**30, estimators="grpo")
    assert "--repeats" not in str(err.value)


def test_the_limit_is_exact_at_its_edge_and_set_by_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert max_draws() == MAX_DRAWS
    check_draws("w", "n", MAX_DRAWS // 7, 7)  # at the limit or under: runs
    with pytest.raises(InputError, match=f"n at most {MAX_DRAWS // 7:,} fits"):
        check_draws("w", "n", MAX_DRAWS // 7 + 1, 7)
    monkeypatch.setenv(ENV, "100")
    with pytest.raises(InputError, match="n at most 10 fits"):
        check_draws("w", "n", 11, 10)
    monkeypatch.setenv(ENV, "0")  # no limit
    check_draws("w", "n", 10**40, 10**40)
    monkeypatch.setenv(ENV, "1e9")
    with pytest.raises(InputError, match=f"{ENV} must be a whole number"):
        max_draws()


def test_a_run_under_a_lowered_limit_is_refused_and_lifted_by_zero(tmp_path):
    """The default run draws 3 checkpoints x 64 prompts x G 8 x 1 estimator a repeat."""
    args = ["evaluate", "--estimators", "grpo", "--repeats", "3", "--no-trajectory"]
    low = run([*args, "--out", str(tmp_path / "low")], **{ENV: "4000"})
    assert_one_line_error(low, "draws 4,608 rollouts (--repeats 3)", "--repeats at most 2 fits")
    free = run([*args, "--out", str(tmp_path / "free")], **{ENV: "0"})
    assert free.returncode == 0, free.stderr[-2000:]
    assert (tmp_path / "free" / "summary.csv").is_file()
