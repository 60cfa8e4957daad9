"""The notebook API (basis_bench.evaluate, sensitivity, load_rollouts, simulate): the
commands' frames without their files, the same numbers as the files, errors in its terms."""

from __future__ import annotations

import os
import re

import polars as pl
import pytest
from conftest import assert_one_line_error, run_main
from polars.testing import assert_frame_equal

import basis_bench
from basis_bench.errors import InputError

SETTINGS = {"repeats": 40, "oracle_n": 16, "batch_size": 16, "seed": 5}
FLAGS = ["--repeats", "40", "--oracle-n", "16", "--batch-size", "16", "--seed", "5"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("api") / "sim"
    return basis_bench.simulate(
        root, n_prompts=40, ref_n=64, checkpoint_n=32, stages={"early": 0.3, "late": 0.8}
    )


def _files(root) -> set[str]:
    return {os.path.join(d, f) for d, _, names in os.walk(root) for f in names}


def test_evaluate_writes_nothing_without_out(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _files(data.parent)
    result = basis_bench.evaluate(
        data, ["basis", "grpo", "spo_tracker"], write_estimates=True, **SETTINGS
    )
    assert _files(data.parent) == before and not any(tmp_path.iterdir())
    assert result.out is None and result.run.run_id is None
    assert set(result.summary["estimator"]) >= {"basis", "grpo"}
    assert result.summary["checkpoint"].unique().sort().to_list() == ["early", "late"]
    assert (
        "spo_tracker" in result.trajectory["estimator"].to_list()
    )  # stateful: the trajectory only
    # the estimates kept in memory: one row per (repeat, prompt, estimator) of the one-step replay
    basis = result.estimates.filter(pl.col("estimator") == "basis", pl.col("checkpoint") == "late")
    assert basis.height == SETTINGS["repeats"] * SETTINGS["batch_size"]
    mse = result.summary.filter(pl.col("estimator") == "basis", pl.col("checkpoint") == "late")
    assert basis["sq_err"].mean() == pytest.approx(mse["mse"][0])


def test_evaluate_frames_are_the_commands_files(data, tmp_path, monkeypatch, capsys):
    run = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(data), "--estimators",
        "basis,rloo,reinforce_pp", *FLAGS, "--out", str(tmp_path / "cli"),
    )  # fmt: skip
    assert run.code == 0, run.message
    result = basis_bench.evaluate(data, "basis,rloo,reinforce_pp", **SETTINGS)
    tables = ["summary", "g_sweep", "by_heterogeneity", "by_difficulty", "beta_choice"]
    for name in [*tables, "fixed_beta", "trajectory"]:
        frame = getattr(result, name)
        written = pl.read_csv(tmp_path / "cli" / f"{name}.csv", schema=frame.schema)
        assert_frame_equal(frame, written, check_exact=False, rel_tol=1e-12)
    # out= writes the command's files
    again = basis_bench.evaluate(data, "basis,rloo,reinforce_pp", out=tmp_path / "api", **SETTINGS)
    assert again.out == tmp_path / "api" and again.run.run_id is not None
    assert (tmp_path / "api" / "summary.csv").read_bytes() == (
        tmp_path / "cli" / "summary.csv"
    ).read_bytes()


def test_sensitivity_and_load_rollouts(data, tmp_path, monkeypatch, capsys):
    settings = {"repeats": 10, "oracle_n": 16, "batch_size": 16, "parameters": "eps,ref_n"}
    swept = basis_bench.sensitivity(data, **settings)
    run = run_main(
        monkeypatch, capsys, "sensitivity", "--rollouts", str(data), "--repeats", "10",
        "--oracle-n", "16", "--batch-size", "16", "--parameters", "eps,ref_n",
        "--out", str(tmp_path / "cli"),
    )  # fmt: skip
    assert run.code == 0, run.message
    written = pl.read_csv(tmp_path / "cli" / "sensitivity.csv", schema=swept.schema)
    assert_frame_equal(swept, written, check_exact=False, rel_tol=1e-12)
    rollouts = basis_bench.load_rollouts(data, policies=["late"])
    assert rollouts["policy"].unique().to_list() == ["late"] and rollouts.height == 40 * 32


def test_errors_name_the_argument_not_the_flag(data, monkeypatch, capsys):
    cases = [
        ({"batch_size": 1}, "batch_size must be >= 2"),  # the config's range check
        ({"batch_size": 41}, "batch_size 41 exceeds the 40 prompts"),  # the replay's check
        ({"trajectory": False, "folds": 3}, "which trajectory=False turns off"),
    ]
    for settings, needle in cases:
        with pytest.raises(InputError) as err:
            basis_bench.evaluate(data, "basis", **{**SETTINGS, **settings})
        assert needle in str(err.value) and "--" not in str(err.value)
    with pytest.raises(InputError, match="batch_size 41 exceeds"):
        basis_bench.sensitivity(data, batch_size=41, oracle_n=16)
    with pytest.raises(InputError, match=r"^parameters is empty; "):
        basis_bench.sensitivity(data, parameters=[])
    with pytest.raises(InputError, match="n_prompts must be >= 2"):
        basis_bench.simulate(data.parent / "other", n_prompts=1)
    with pytest.raises(InputError, match="evaluate\\(\\) has no setting 'batchsize'"):
        basis_bench.evaluate(data, batchsize=8)
    # the command line still names its flags
    run = run_main(monkeypatch, capsys, "evaluate", "--rollouts", str(data), "--batch-size", "1")
    assert_one_line_error(run, "--batch-size must be >= 2")


# --------------------------------------------------------------------------- issue 44, class 7


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: basis_bench.load_rollouts(""), "rollouts is empty"),
        (lambda: basis_bench.evaluate(""), "rollouts is empty"),
        (lambda: basis_bench.evaluate(rollouts="  "), "rollouts is empty"),
        (lambda: basis_bench.sensitivity(""), "rollouts is empty"),
        (lambda: basis_bench.simulate(""), "out is empty"),
        (lambda: basis_bench.evaluate(out=""), "out is empty"),
        (lambda: basis_bench.evaluate(pl.DataFrame({"a": [1]})), "rollouts must be a path"),
        (lambda: basis_bench.load_rollouts(pl.DataFrame({"a": [1]})), "rollouts must be a path"),
        (lambda: basis_bench.simulate(pl.DataFrame({"a": [1]})), "out must be a path"),
        (lambda: basis_bench.evaluate(estimators=5), "estimators must be a comma-separated"),
        (lambda: basis_bench.evaluate(estimators=[1, 2]), "estimators must hold names"),
        (lambda: basis_bench.evaluate(checkpoints={"a": 1}), "checkpoints must be a comma"),
    ],
)
def test_the_api_refuses_what_the_cli_refuses_naming_the_argument(
    call, needle, tmp_path, monkeypatch
):
    """load_rollouts("") returned the shipped dataset, evaluate("") and simulate("") used the
    current folder, a polars frame as the dataset became a file name."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=needle):
        call()
    assert not any(tmp_path.iterdir())


def test_policies_are_names_never_letters_and_must_be_held(data):
    """policies="late" was read letter by letter and gave an empty frame, as did ["nope"]."""
    late = basis_bench.load_rollouts(data, "late")
    assert late.height > 0 and late["policy"].unique().to_list() == ["late"]
    both = basis_bench.load_rollouts(data, "late,early")
    assert set(both["policy"].unique()) == {"early", "late"}
    with pytest.raises(InputError, match=r"policies 'nope' not in .* its policies: early, late"):
        basis_bench.load_rollouts(data, ["nope"])


def test_estimators_may_be_a_numpy_array(data):
    """np.array([...]) raised numpy's "ambiguous truth value"."""
    import numpy as np

    result = basis_bench.evaluate(data, np.array(["basis", "grpo"]), trajectory=False, **SETTINGS)
    assert set(result.summary["estimator"]) == {"basis", "grpo"}


def test_two_threads_writing_one_out_are_one_writer(data, tmp_path, monkeypatch):
    """Both were accepted: the POSIX lock is the process's, so a second thread got it too."""
    import threading

    import basis_bench.evaluation.run as run_module

    out = tmp_path / "out"
    inside, release = threading.Event(), threading.Event()
    real = run_module._write_run

    def slow(*args, **kwargs):
        inside.set()
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "_write_run", slow)
    errors: list[BaseException] = []

    def first() -> None:
        try:
            basis_bench.evaluate(data, "grpo", out=out, trajectory=False, **SETTINGS)
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=first)
    worker.start()
    assert inside.wait(60)
    try:
        with pytest.raises(InputError, match="being written by another basis-bench command"):
            basis_bench.evaluate(data, "grpo", out=out, trajectory=False, **SETTINGS)
    finally:
        release.set()
        worker.join(60)
    assert not errors and (out / "summary.csv").is_file()
    # the lock is let go when the call returns: this thread may write there now
    basis_bench.evaluate(data, "grpo", out=out, trajectory=False, **SETTINGS)


def test_a_full_disk_leaves_no_folder_holding_only_the_lock(data, tmp_path):
    """evaluate(out=...) on a full disk left a folder holding only the lock file."""
    from conftest import mounted_tmpfs

    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, "size=4k") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here")
        filler = disk / "filler"
        with open(filler, "wb") as fh:  # every block taken; inodes left for the lock file
            try:
                fh.write(b"x" * 65536)
            except OSError:
                pass
        with pytest.raises(OSError, match="no space left on the device"):
            basis_bench.evaluate(data, "grpo", out=disk / "out", trajectory=False, **SETTINGS)
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"stages": "early"}, "stages must map checkpoint names"),
        ({"stages": ["early"]}, "stages must map checkpoint names"),
        ({"mixture": (1.0, 2.0, 2.0)}, "mixture must be (weight, a, b) triples"),
    ],
)
def test_simulate_refuses_settings_of_the_wrong_shape_by_name(tmp_path, settings, needle):
    """stages="early" was an AttributeError traceback (found beside class 7)."""
    with pytest.raises(InputError, match=re.escape(needle)):
        basis_bench.simulate(tmp_path / "s", **settings)
    assert not (tmp_path / "s").exists()


def test_evaluate_warns_where_the_oracle_noise_rivals_the_mse(data):
    """A 2-sample oracle: the noise (up to 1/8 a prompt) rivals the MSEs; the notebook gets
    the warning run.json keeps."""
    with pytest.warns(UserWarning, match="the oracle's noise rivals the MSE") as caught:
        result = basis_bench.evaluate(
            data, ["basis", "grpo"], **{**SETTINGS, "oracle_n": 2}, trajectory=False
        )
    assert [str(w.message) for w in caught] == list(result.run.warnings)


@pytest.mark.parametrize("where", ["a file", "inside the dataset", "a literal ~", "the cwd"])
def test_a_refused_out_names_the_argument(data, tmp_path, monkeypatch, where):
    """The claim's refusals named the flag in the notebook too ("--out x is a file")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    out = {
        "a file": tmp_path / "f",
        "inside the dataset": data / "results",
        "a literal ~": "~/x",
        "the cwd": tmp_path,
    }[where]
    with pytest.raises(InputError) as err:
        basis_bench.evaluate(data, "grpo", out=out, trajectory=False, **SETTINGS)
    message = str(err.value)
    assert message.startswith("out ") and "--" not in message, message
    with pytest.raises(InputError, match=r"^out "):
        basis_bench.simulate(tmp_path / "f")


@pytest.mark.parametrize(
    "call",
    [
        lambda d: basis_bench.evaluate(d, estimators=""),
        lambda d: basis_bench.evaluate(d, estimators=[]),
        lambda d: basis_bench.evaluate(d, checkpoints=[]),
        lambda d: basis_bench.load_rollouts(d, policies=[]),
        lambda d: basis_bench.load_rollouts(d, policies=" , "),
        lambda d: basis_bench.sensitivity(d, estimators=[]),
    ],
)
def test_no_names_is_refused_not_the_default_or_nothing(data, call):
    """estimators="" ran every estimator, policies=[] returned an empty frame: an empty list
    (an unset variable's) is refused, as an empty path is."""
    with pytest.raises(InputError, match=r"^(estimators|checkpoints|policies) is empty; "):
        call(data)


@pytest.mark.parametrize("command", ["evaluate", "sensitivity"])
def test_an_empty_estimators_option_is_refused(monkeypatch, capsys, tmp_path, command):
    """--estimators '' (a "$UNSET" variable) ran every estimator, or sensitivity's default."""
    out = tmp_path / "o"
    result = run_main(monkeypatch, capsys, command, "--estimators", "", "--out", str(out))
    assert_one_line_error(result, "--estimators is empty; ")
    assert not out.exists()
