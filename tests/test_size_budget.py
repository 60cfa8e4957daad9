"""Sizes that reached an allocation unchecked (issue 44, class 1): every allocation-sized
number, a flag or a dataset's own training.json alike, passes the one size budget
(``memory_check.check_sizes``) before anything is allocated, and the refusal names the
setting and the value of it that fits. The command-line cases run under ``ulimit -v
4000000``, as the issue asks: a check that only works without a limit does not count."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CLI, ONE_THREAD, assert_one_line_error, run_main

from basis_bench.errors import InputError

DENSE = Path(__file__).resolve().parents[1] / "basis_bench" / "data" / "dense"
LIMIT_KB = 4_000_000  # ulimit -v 4000000


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (LIMIT_KB * 1024, LIMIT_KB * 1024))


def run_limited(args: list[str]) -> subprocess.CompletedProcess[str]:
    """``basis-bench ARGS`` in a fresh interpreter under ``ulimit -v 4000000``."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=300, env=ONE_THREAD,
        preexec_fn=_limited,
    )  # fmt: skip


def _dense_with(tmp_path: Path, **record: object) -> Path:
    data = tmp_path / "dense"
    shutil.copytree(DENSE, data)
    for path in data.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    path = data / "training.json"
    text = json.loads(path.read_text())
    steps = record.pop("steps", {})
    text["steps"].update(steps)
    text.update(record)
    path.write_text(json.dumps(text))
    return data


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--standing-steps", "1000000000"], "--standing-steps at most"),
        (["--standing-steps", str(10**30)], "--standing-steps at most"),
        (["--rollouts-per-step", "1000000000"], "--rollouts-per-step at most"),
        (["--folds", "1000000000"], "--folds at most"),
    ],
)
def test_step_replay_flags_are_sized_before_they_allocate(tmp_path, extra, needle):
    """--standing-steps 10^9 grew to 23.7 GB in 34 s; --rollouts-per-step 10^9 ended in a
    MemoryError traceback."""
    out = tmp_path / "out"
    result = run_limited(["evaluate", "--rollouts", str(DENSE), *extra, "--out", str(out)])
    assert_one_line_error(
        result, "this step replay needs about", "GiB by the budget's estimate", needle
    )  # the bytes a unit costs are estimated (docs/failure_behaviour.md), and it says so
    assert not out.exists()


def test_the_epoch_replays_epochs_are_sized_before_they_allocate(tmp_path):
    """--trajectory-epochs 10^9 asked numpy for 14.6 TiB: a MemoryError traceback (found
    beside class 1's step replay cases)."""
    out = tmp_path / "out"
    args = ["--trajectory-schedule", "epochs", "--trajectory-epochs", "1000000000"]
    result = run_limited(["evaluate", "--rollouts", str(DENSE), *args, "--out", str(out)])
    assert_one_line_error(result, "this trajectory replay needs", "--trajectory-epochs at most")
    assert not out.exists()


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"prompts_per_step": 1_000_000_000}, "prompts_per_step of"),
        ({"steps": {"step-030": 10**12}}, "the steps spanned by"),
    ],
)
def test_a_datasets_training_record_is_sized_before_it_allocates(tmp_path, record, needle):
    """ "prompts_per_step": 10^9 grew by 100 MB/s with no error; a step of 10^12 asked numpy
    for 7.28 TiB. The refusal names the file's field and what fits."""
    data = _dense_with(tmp_path, **record)
    out = tmp_path / "out"
    result = run_limited(["evaluate", "--rollouts", str(data), "--out", str(out)])
    assert_one_line_error(result, needle, "training.json", "at most")
    assert not out.exists()


def test_the_dense_data_replays_under_the_limit(tmp_path):
    """The budget is loose from above but does not refuse the shipped step replay."""
    out = tmp_path / "out"
    args = ["evaluate", "--rollouts", str(DENSE), "--repeats", "2", "--out", str(out)]
    result = run_limited([*args, "--estimators", "grpo", "--standing-steps", "5"])
    assert result.returncode == 0, result.stderr
    assert (out / "trajectory.csv").is_file()


def test_the_library_replay_passes_the_same_budget(monkeypatch):
    """replay_steps (the notebook's entry) checks before building its timeline."""
    import basis_bench.guards.memory_check as memory_check
    from basis_bench.evaluation.dataset import open_dataset
    from basis_bench.evaluation.replay_plan import ReplayPlan
    from basis_bench.evaluation.step_replay import StepSchedule, replay_steps

    ds = open_dataset(str(DENSE))
    monkeypatch.setattr(memory_check, "available_memory", lambda: 2**30)
    plan, steps = ReplayPlan(2, group_size=4), StepSchedule(16, standing_steps=10**12)
    with pytest.raises(InputError, match=r"standing.steps at most"):
        replay_steps(ds.rewards, ds.reference, ds.checkpoints[:2], [3, 6], ["grpo"], plan, steps)


def test_the_budget_names_what_fits_and_never_overflows(monkeypatch):
    import basis_bench.guards.memory_check as memory_check
    from basis_bench.guards.memory_check import Size, check_sizes

    monkeypatch.setattr(memory_check, "available_memory", lambda: 1000)
    assert check_sizes("x", [Size("--a", 10, 10), Size("--b", 5, 2)]) == 110
    with pytest.raises(InputError, match=r"--a at most 99 fits$"):
        check_sizes("x", [Size("--a", 100, 10), Size("--b", 5, 2)])
    with pytest.raises(InputError, match=r"about 10\^399.*--a at most 100 fits"):
        check_sizes("x", [Size("--a", 10**399, 10)])
    with pytest.raises(InputError, match="lower --a or free memory"):
        check_sizes("x", [Size("--a", 1, 10)], base=2000)


def test_a_ulimit_counts_as_free_memory():
    """Under ``ulimit -v`` MemAvailable said 20 GB and numpy's 7.45 GiB was a MemoryError."""
    code = (
        "import resource; from basis_bench.guards.memory_check import available_memory; "
        "print(available_memory())"
    )
    out = subprocess.run(
        [CLI[0], "-c", code], capture_output=True, text=True, preexec_fn=_limited, check=True
    )
    assert int(out.stdout) < LIMIT_KB * 1024


# --------------------------------------------------------------------------- train


def _config(tmp_path: Path, run: Path) -> Path:
    config = tmp_path / "c.toml"
    config.write_text(f'run_dir = "{run}"\ncache_dir = "{tmp_path / "cache"}"\n')
    return config


def _no_model(monkeypatch) -> None:
    import basis_bench.guards.memory_check as memory_check
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    monkeypatch.setattr(memory_check, "available_memory", lambda: LIMIT_KB * 1024)


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["probe_every=1", "probe_samples=2000000"], "probe_samples at most"),
        (["ref_n=50000000"], "ref_n at most"),
        (["rollouts_per_step=1000000000"], "rollouts_per_step at most"),
    ],
)
def test_train_sizes_are_refused_before_a_model_loads(monkeypatch, capsys, tmp_path, sets, needle):
    """probe_samples=2000000 and ref_n=50000000 ended in a MemoryError after the model had
    loaded."""
    _no_model(monkeypatch)
    run = tmp_path / "run"
    args = ["train", "--config", str(_config(tmp_path, run))]
    for item in sets:
        args += ["--set", item]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, "this training run needs about", needle)
    assert not run.exists()


@pytest.mark.parametrize("how", ["set", "seeds"])
def test_a_seed_above_the_largest_is_refused_before_a_model_loads(
    monkeypatch, capsys, tmp_path, how
):
    """A seed above 2**64 ended in torch's overflow traceback after the model loaded."""
    _no_model(monkeypatch)
    big = str(2**64 + 1)
    run = tmp_path / "run"
    args = ["train", "--config", str(_config(tmp_path, run))]
    args += ["--set", f"seed={big}"] if how == "set" else ["--seeds", f"0,{big}"]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, "seed must be in [0, 9223372036854775807]")
    assert not run.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["evaluate", "--seed", str(2**64)],
        ["simulate", "--seed", str(2**64), "--prompts", "4"],
        ["simulate", "--seed", str(10**400), "--prompts", "4"],
    ],
)
def test_every_commands_seed_has_the_same_bound(monkeypatch, capsys, tmp_path, args):
    """numpy's uint64 counters overflowed at 2**64; float(10**400) raised OverflowError."""
    result = run_main(monkeypatch, capsys, *args, "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "seed must be in [0, 9223372036854775807]")
    assert not (tmp_path / "o").exists()


def test_an_integer_bound_is_exact():
    from basis_bench.settings import MAX_SEED, check_scalar

    assert check_scalar(MAX_SEED, "seed", int, min_val=0, max_val=MAX_SEED) == MAX_SEED
    with pytest.raises(InputError, match="seed must be in"):
        check_scalar(MAX_SEED + 1, "seed", int, min_val=0, max_val=MAX_SEED)


def test_an_oracle_part_is_sized_before_the_claim_or_a_model(monkeypatch, capsys, tmp_path):
    """--n of 5 * 10^7 reached the sampler (found beside train's ref_n: the reference
    cache is an oracle run too)."""
    import basis_bench.guards.memory_check as memory_check
    import basis_bench.rollouts.oracle as oracle

    monkeypatch.setattr(memory_check, "available_memory", lambda: LIMIT_KB * 1024)
    monkeypatch.setattr(oracle, "open_source", lambda *a, **k: pytest.fail("opened the model"))
    out = tmp_path / "o"
    args = ["oracle", "--model", "smollm2-135m", "--policy", "p", "--prompts", "arithmetic:n=4"]
    result = run_main(monkeypatch, capsys, *args, "--n", "50000000", "--out", str(out))
    assert_one_line_error(result, "one part of this oracle run needs", "--n at most")
    assert not out.exists()
