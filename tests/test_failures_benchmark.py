"""The value benchmark's failures (issue 14, part 2, and the hunt of issue 22): simulate,
evaluate and sensitivity refuse bad options and folders in one line and write nothing, a
rerun replaces a run whole, and the estimators' boundary names what is wrong.

Figures over evaluate's results are in ``test_failures_figures.py``.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import (
    EVAL,
    EVAL_GROUP,
    assert_one_line_error,
    evaluate_args,
    run_main,
    siblings,
    snapshot,
)

from basis_bench.errors import InputError
from basis_bench.guards.locks import LOCK_FILE
from basis_bench.guards.outputs import OUTPUT_MARKER, read_output_marker
from basis_bench.rollouts.simulate import SimulationConfig, simulate
from basis_bench.rollouts.store import load_rollouts

SMALL_SIM = ["--prompts", "12", "--ref-n", "4", "--checkpoint-n", "6"]


# --------------------------------------------------------------------------- simulate


def test_simulate_refuses_a_real_dataset_and_changes_no_byte(
    monkeypatch, capsys, real_dataset, tmp_path
):
    before = snapshot(real_dataset)
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(real_dataset), *SMALL_SIM)
    assert_one_line_error(result, str(real_dataset), "real rollouts", "--force")
    assert snapshot(real_dataset) == before
    (tmp_path / "file").write_text("x")
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(tmp_path / "file"))
    assert_one_line_error(result, "is a file")


def test_simulate_rerun_replaces_its_own_dataset_whole(tmp_path):
    out = tmp_path / "sim"
    simulate(SimulationConfig(n_prompts=6, ref_n=2, checkpoint_n=2), out)
    assert (out / "rollouts" / "middle.parquet").is_file()
    simulate(SimulationConfig(n_prompts=4, ref_n=2, checkpoint_n=2, stages={"a": 1.0}), out)
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == [
        "a.parquet",
        "reference.parquet",
    ]
    assert load_rollouts(out)["prompt_id"].n_unique() == 4


# --------------------------------------------------------------------------- value benchmark
# (issue 14, part 2: evaluate, sensitivity and the estimators' boundary)


def test_simulate_force_writes_over_a_real_dataset(monkeypatch, capsys, real_dataset):
    before = snapshot(real_dataset)
    refused = run_main(monkeypatch, capsys, "simulate", "--out", str(real_dataset), *SMALL_SIM)
    assert_one_line_error(refused, "real rollouts", "--force")
    assert snapshot(real_dataset) == before
    args = ["simulate", "--out", str(real_dataset), *SMALL_SIM, "--force"]
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert read_output_marker(real_dataset)["simulated"] == "mixed"


def test_evaluate_refuses_out_inside_rollouts_and_other_kinds(
    monkeypatch, capsys, sim_dataset, real_dataset, tmp_path
):
    before = snapshot(sim_dataset)
    for out in (sim_dataset / "results", sim_dataset):
        result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))
        assert_one_line_error(result, "inside the rollouts dataset")
    assert snapshot(sim_dataset) == before
    real = snapshot(real_dataset)
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, real_dataset))
    assert_one_line_error(result, "already holds a rollouts dataset", "choose a new or empty")
    assert "--force" not in result.message  # evaluate has none
    assert snapshot(real_dataset) == real
    (tmp_path / "file").write_text("keep")
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "file"))
    assert_one_line_error(result, "is a file")
    assert (tmp_path / "file").read_text() == "keep"


def test_evaluate_with_only_a_stateful_estimator_reports_its_trajectory(sim_dataset, tmp_path):
    """basis_memory has no one-step rows: the run still succeeds (it used to crash on the empty
    summary table), trajectory.csv holds its numbers and the console prints them."""
    from typer.testing import CliRunner

    from basis_bench.cli import app

    out = tmp_path / "res"
    args = evaluate_args(sim_dataset, out, "--estimators", "basis_memory", "--no-estimates")
    result = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    traj = pl.read_csv(out / "trajectory.csv")
    assert traj["estimator"].unique().to_list() == ["basis_memory"]
    # ... and the console shows them: one row per estimator, one column per checkpoint
    mse = traj.filter(pl.col("scope") == "checkpoint")["mse_noise_corrected"].to_list()
    row = next(line for line in result.output.splitlines() if "basis_memory" in line)
    assert row.split()[2:-1] == [f"{v:.5f}" for v in mse]


def test_a_rerun_replaces_the_whole_run(monkeypatch, capsys, sim_dataset, tmp_path):
    out = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0
    assert (out / "g_sweep.csv").exists()
    args = evaluate_args(sim_dataset, out, "--estimators", "basis", "--no-estimates")
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert not (out / "g_sweep.csv").exists()
    assert not (out / "estimates.parquet").exists()
    run = json.loads((out / "run.json").read_text())
    files = {f.name for f in out.iterdir()} - {OUTPUT_MARKER, LOCK_FILE, "run.json"}
    assert set(run["tables"]) == files
    assert pl.read_csv(out / "summary.csv")["estimator"].unique().to_list() == ["basis"]
    assert siblings(out) == []


def test_a_failed_run_keeps_the_earlier_run_whole(monkeypatch, capsys, sim_dataset, tmp_path):
    import basis_bench.evaluation.run as run_module

    out = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0
    before = snapshot(out)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "summary.csv"))

    monkeypatch.setattr(run_module, "replay_schedule", full)  # after every per-batch table
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out, "--seed", "1"))
    assert_one_line_error(result, "no space left", "earlier run whole", code=1)
    assert snapshot(out) == before
    assert siblings(out) == []


def test_a_read_only_parent_is_one_line(monkeypatch, capsys, sim_dataset, tmp_path):
    import basis_bench.evaluation.tables as tables_module

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    monkeypatch.setattr(tables_module.tempfile, "mkdtemp", read_only)
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "res"))
    assert_one_line_error(result, "read-only file system", code=1)


@pytest.mark.parametrize("command", ["evaluate", "sensitivity", "figures"])
@pytest.mark.parametrize("given", ["file", "missing"])
def test_a_file_or_a_missing_path_as_input_folder_says_which(
    monkeypatch, capsys, tmp_path, command, given
):
    """``--rollouts FILE`` once said "does not exist", and figures advised running evaluate
    into the file: the message says what the path is, and nothing is written."""
    source = tmp_path / "rollouts.parquet"
    if given == "file":
        source.write_text("mine")
    option = "--results" if command == "figures" else "--rollouts"
    out = tmp_path / "out"
    result = run_main(monkeypatch, capsys, command, option, str(source), "--out", str(out))
    needle = "is a file, not a" if given == "file" else "does not exist"
    assert_one_line_error(result, str(source), needle)
    assert not out.exists()
    assert given == "missing" or source.read_text() == "mine"


def test_estimator_lists(sim_dataset, tmp_path):
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.run import evaluate

    cfg = EvaluateConfig(
        rollouts=str(sim_dataset), repeats=3, oracle_n=2, ref_n=4, batch_size=4, group_size=2
    )
    only = evaluate(
        EvaluateConfig(**{**cfg.__dict__, "estimators": ("spo_tracker",)}), tmp_path / "a"
    )
    assert only.trajectory is not None and only.summary.is_empty()
    assert set(only.trajectory["estimator"]) == {"spo_tracker"}
    both = evaluate(
        EvaluateConfig(**{**cfg.__dict__, "estimators": ("all", "basis")}), tmp_path / "b"
    )
    assert not both.summary.select("checkpoint", "estimator").is_duplicated().any()
    assert "basis" in set(both.summary["estimator"])


@pytest.mark.parametrize("eps", ["nan", "-1"])
def test_eps_is_checked_through_the_cli(monkeypatch, capsys, sim_dataset, tmp_path, eps):
    result = run_main(
        monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "r"), "--eps", eps
    )
    assert_one_line_error(result, "eps")
    assert not (tmp_path / "r").exists()
    args = [
        "sensitivity",
        "--rollouts",
        str(sim_dataset),
        "--out",
        str(tmp_path / "s"),
        "--eps",
        eps,
    ]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "eps")
    assert not (tmp_path / "s").exists()


def test_sensitivity_repeats_zero_is_one_line(monkeypatch, capsys, sim_dataset, tmp_path):
    args = ["sensitivity", "--rollouts", str(sim_dataset), "--out", str(tmp_path / "s")]
    assert_one_line_error(run_main(monkeypatch, capsys, *args, "--repeats", "0"), "--repeats")
    assert not (tmp_path / "s").exists()


def test_sensitivity_batch_larger_than_the_prompts_is_one_line(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """Every point of the sweep would be skipped: once an empty-concat traceback."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--out", str(out)]
    assert run_main(monkeypatch, capsys, *args).code == 0
    before = snapshot(out)
    result = run_main(monkeypatch, capsys, *args, "--batch-size", "4000000000")
    assert_one_line_error(result, "--batch-size 4000000000 exceeds the 12 prompts")
    assert snapshot(out) == before


def test_sensitivity_without_a_point_to_sweep_is_one_line(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """An empty --parameters, or one whose every value is beyond the data (ref_n above the 4
    cached samples, B above the 12 prompts), was polars' "cannot concat empty list"
    traceback; a parameter named twice wrote its rows twice."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--out", str(out)]
    for parameters, needle in [
        ("", "--parameters names none"),
        (" , ", "--parameters names none"),
        ("ref_n", "no value of --parameters ref_n fits this dataset"),
        ("ref_n,batch_size", "its 4 cached reference samples, batch_size at most its 12 prompts"),
    ]:
        result = run_main(monkeypatch, capsys, *args, "--parameters", parameters)
        assert_one_line_error(result, needle)
        assert not out.exists()
    assert run_main(monkeypatch, capsys, *args, "--parameters", "grid_size,grid_size").code == 0
    table = pl.read_csv(out / "sensitivity.csv")
    assert table.height == len(table.unique()) == 4 * table["checkpoint"].n_unique()


def test_sensitivity_refuses_a_fixed_beta_off_a_swept_grid_before_the_sweep(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """40.0125 is on --grid-size 32's grid, not on the 8-beta grid of the grid_size sweep:
    the sweep stopped there, blaming --grid-size."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--out", str(out)]
    args += ["--calibration", "fixed", "--fixed-beta", "40.0125"]
    result = run_main(monkeypatch, capsys, *args, "--parameters", "eps,grid_size")
    assert_one_line_error(result, "not on the 8-beta grid that --parameters grid_size sweeps")
    assert not out.exists()
    assert run_main(monkeypatch, capsys, *args, "--parameters", "eps").code == 0


def test_sensitivity_says_which_prompts_it_dropped(monkeypatch, capsys, sim_dataset, tmp_path):
    """Prompts without reference samples were dropped silently (evaluate says so)."""
    path = sim_dataset / "rollouts" / "reference.parquet"
    table = pq.read_table(path)
    kept = pl.from_arrow(table).filter(pl.col("prompt_id").is_in(["sim-00", "sim-01"]).not_())
    pq.write_table(kept.to_arrow().replace_schema_metadata(table.schema.metadata), path)
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--parameters", "eps"]
    result = run_main(monkeypatch, capsys, *args, "--out", str(tmp_path / "s"))
    assert result.code == 0
    assert "checkpoint late: dropped 2 prompt(s) missing from the reference cache" in result.out


def test_sensitivity_refuses_estimators_it_cannot_sweep(monkeypatch, capsys, sim_dataset, tmp_path):
    """--estimators all swept basis alone, spo_tracker was a traceback (beside basis it was
    dropped), and james_stein was told to "drop grpo/rloo"."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--parameters", "eps"]
    for names, needle in [
        ("all", "not 'all'"),
        ("basis,all", "not 'all'"),
        ("spo_tracker", "drop spo_tracker from --estimators"),
        ("basis,spo_tracker", "drop spo_tracker from --estimators"),
        ("basis,james_stein", "drop james_stein from --estimators"),
        ("basis_memory", "drop basis_memory from --estimators"),
    ]:
        result = run_main(monkeypatch, capsys, *args, "--estimators", names, "--out", str(out))
        assert_one_line_error(result, needle)
        assert not out.exists()


def test_a_comma_separated_checkpoint_list_is_told_to_repeat_the_option(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    args = ["evaluate", "--rollouts", str(sim_dataset), *EVAL_GROUP, "--out", str(tmp_path / "r")]
    result = run_main(monkeypatch, capsys, *args, "--checkpoint", "early, late")
    assert_one_line_error(
        result, "unknown checkpoint(s) 'early, late'", "--checkpoint early --checkpoint late"
    )


def test_a_dataset_link_to_nothing_is_named(monkeypatch, capsys, sim_dataset, tmp_path):
    """A dangling x.parquet link was 'a folder in the path does not exist (removed while the
    command ran?)', exit 1."""
    ghost = sim_dataset / "rollouts" / "ghost.parquet"
    ghost.symlink_to(tmp_path / "gone.parquet")
    args = ["evaluate", "--rollouts", str(sim_dataset), *EVAL_GROUP, "--out", str(tmp_path / "r")]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, f"{ghost} is a symbolic link to nothing")
    assert not (tmp_path / "r").exists()


def test_the_inner_rollouts_folder_given_for_the_dataset_is_refused(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """--rollouts DATASET/rollouts ran without the prompts table, and --out DATASET/res then
    wrote a results folder inside the dataset, breaking it for every later command."""
    before = snapshot(sim_dataset)
    inner = sim_dataset / "rollouts"
    for command, extra in [("evaluate", ["--group-size", "2"]), ("sensitivity", [])]:
        args = [command, "--rollouts", str(inner), *EVAL, *extra, "--out", str(sim_dataset / "res")]
        result = run_main(monkeypatch, capsys, *args)
        assert_one_line_error(result, "is the rollouts/ folder of the dataset", str(sim_dataset))
        assert snapshot(sim_dataset) == before


def test_simulate_refuses_sizes_that_cannot_fit_before_writing(monkeypatch, capsys, tmp_path):
    earlier = tmp_path / "earlier"
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), earlier)
    before = snapshot(earlier)
    for out in (tmp_path / "new", earlier):
        for extra, needle in [
            (["--prompts", "1000000000"], "GiB of memory is free"),
            (["--checkpoint-n", "1000000000000"], "--checkpoint-n must be in [1, 2147483647]"),
            (["--ref-n", "3000000000"], "--ref-n must be in [1, 2147483647]"),
        ]:
            result = run_main(monkeypatch, capsys, "simulate", "--out", str(out), *extra)
            assert_one_line_error(result, needle)
    assert not (tmp_path / "new").exists()
    assert snapshot(earlier) == before


@pytest.mark.parametrize("command", ["evaluate", "sensitivity", "simulate"])
def test_a_negative_seed_is_one_line_and_writes_nothing(
    monkeypatch, capsys, sim_dataset, tmp_path, command
):
    new, earlier = tmp_path / "new", tmp_path / "earlier"
    if command == "simulate":
        args = ["simulate", *SMALL_SIM, "--out"]
        simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), earlier)
    else:
        options = EVAL_GROUP if command == "evaluate" else EVAL
        args = [command, "--rollouts", str(sim_dataset), *options, "--out"]
        assert run_main(monkeypatch, capsys, *args, str(earlier)).code == 0
    before = snapshot(earlier)
    for out in (new, earlier):
        result = run_main(monkeypatch, capsys, *args, str(out), "--seed", "-1")
        assert_one_line_error(result, "--seed must be in [0, 9223372036854775807]; got -1")
    assert not new.exists()
    assert snapshot(earlier) == before


def test_rewards_outside_unit_interval_name_the_tracker_before_the_replay(
    monkeypatch, capsys, tmp_path
):
    import basis_bench.evaluation.run as run_module

    data = tmp_path / "wide"
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), data)
    for f in (data / "rollouts").glob("*.parquet"):
        table = pq.read_table(f)
        rewards = table["reward"].to_numpy() * 2
        pq.write_table(
            table.set_column(table.schema.get_field_index("reward"), "reward", [rewards]), f
        )

    def no_replay(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the replay started")

    monkeypatch.setattr(run_module, "_replay_all", no_replay)
    result = run_main(monkeypatch, capsys, *evaluate_args(data, tmp_path / "r"))
    assert_one_line_error(result, "outside [0, 1]", "spo_tracker", "--estimators vanilla,")
    assert "basis_memory" in result.message  # its Beta posterior needs [0, 1] too
    assert "spo_tracker" not in result.message.split("--estimators")[1]  # the list to keep had it
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("bad", ["garbage", "folder"])
def test_a_parquet_name_that_is_not_parquet(monkeypatch, capsys, sim_dataset, tmp_path, bad):
    path = sim_dataset / "rollouts" / "x.parquet"
    if bad == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"not parquet at all")
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "r"))
    assert_one_line_error(
        result, "x.parquet", "folder" if bad == "folder" else "not a readable Parquet"
    )


@pytest.mark.parametrize(
    "rewards",
    ["int", "bool", "list", "bfloat16", "grad"],
)
def test_basis_accepts_ints_bools_lists_bfloat16_and_grad_tensors(rewards):
    import torch

    from basis_bench.estimators import Basis

    ids = ["a", "b", "c", "d"]
    cache = np.random.default_rng(0).integers(0, 2, size=(4, 16)).astype(float)
    basis = Basis(ids, cache)
    expected = np.asarray(basis(ids, np.array([1.0, 0.0, 0.0, 1.0])).baselines)
    given: Any = {
        "int": np.array([1, 0, 0, 1]),
        "bool": np.array([True, False, False, True]),
        "list": [1, 0, 0, 1],
        "bfloat16": torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.bfloat16),
        "grad": torch.tensor([1.0, 0.0, 0.0, 1.0], requires_grad=True),
    }[rewards]
    got = basis(ids, given).baselines
    values = got.detach().numpy() if hasattr(got, "detach") else np.asarray(got)
    assert np.allclose(values, expected, atol=1e-6)
    assert values.any()  # integer rewards gave all-zero baselines
    f32 = basis(ids, np.array([1, 0, 0, 1], dtype=np.float32)).baselines
    assert f32.dtype == np.float32  # floating dtypes keep theirs
    with pytest.raises(InputError, match="numbers"):
        basis(ids, ["a", "b", "c", "d"])


def test_leave_one_out_refuses_a_batch_of_one():
    from basis_bench.estimators import Basis, EstimatorInput, TiltTable, default_betas, get

    cache = np.ones((1, 8)) * 0.5
    with pytest.raises(InputError, match="at least 2 prompts"):
        Basis(["a"], cache)(["a"], np.array([1.0]))
    table = TiltTable.from_cache(cache, default_betas(8))
    v, var = table.gather(np.array([0]))
    batch = EstimatorInput(np.array([[1.0]]), v, var, table.betas)
    with pytest.raises(InputError, match="B=1"):
        get("basis")(batch)


def test_an_estimator_returning_the_wrong_shape_is_named():
    from basis_bench.estimators import ESTIMATORS, EstimatorInput, register_estimator

    with ESTIMATORS.temporary():

        @register_estimator("wrong_shape_test")
        def _wrong(batch):
            return batch.rewards[..., 0]

        with pytest.raises(InputError, match="'wrong_shape_test' returned baselines of shape"):
            ESTIMATORS["wrong_shape_test"](EstimatorInput(np.ones((4, 1)) * 0.5))
    assert "wrong_shape_test" not in ESTIMATORS


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


@pytest.mark.parametrize("command", ["import", "simulate", "evaluate"])
def test_a_name_too_long_for_the_file_system_is_one_line(
    monkeypatch, capsys, sim_dataset, tmp_path, command
):
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\n")
    args = {
        "import": ["import", "counts", str(source), "--policy", "ck"],
        "simulate": ["simulate", *SMALL_SIM],
        "evaluate": ["evaluate", "--rollouts", str(sim_dataset), *EVAL_GROUP],
    }[command]
    out = tmp_path / ("x" * 300) / "out"  # once a traceback (file name too long)
    result = run_main(monkeypatch, capsys, *args, "--out", str(out))
    assert_one_line_error(result, "is 300 bytes long", "at most 255")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv", "sim"]


def test_a_folder_removed_under_a_running_command_is_one_line(monkeypatch, capsys, tmp_path):
    import basis_bench.rollouts.simulate as simulate_module

    def removed(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(tmp_path / "gone"))

    monkeypatch.setattr(simulate_module, "write_parquet_atomic", removed)
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(tmp_path / "s"), *SMALL_SIM)
    assert_one_line_error(result, "does not exist (removed while the command ran?)", code=1)


def test_a_rollouts_link_to_nothing_says_so(monkeypatch, capsys, tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for link in ("loop", "dangling"):
        args = evaluate_args(tmp_path / link, tmp_path / "out")
        assert_one_line_error(run_main(monkeypatch, capsys, *args), "a symbolic link to nothing")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--grid-size", "100000000"], "--grid-size must be in [1, 1024]"),  # once an OOM kill
        (["--option", "basis.eps=0.1", "--option", "basis.eps=0.2"], "basis.eps is given twice"),
    ],
)
def test_evaluate_refuses_a_grid_too_large_and_an_option_given_twice(
    monkeypatch, capsys, sim_dataset, tmp_path, extra, needle
):
    out = tmp_path / "res"
    assert_one_line_error(
        run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out, *extra)), needle
    )
    assert not out.exists()
