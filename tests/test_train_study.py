"""The training study's arithmetic and bookkeeping without a model: the Student-t interval
against tables and a hand computation, seed bands, the per-run and per-arm summary tables
on synthetic logs, and which seeds the runner skips, resumes or starts."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import assert_one_line_error, import_extra, run_main

from basis_bench.errors import InputError
from basis_bench.train import make_config
from basis_bench.train.checkpoint import TRAINER_STATE
from basis_bench.train.config import config_dict
from basis_bench.train.loop import append_jsonl
from basis_bench.train.seeds import clear_partial_run, prune_checkpoints, run_state, seed_config
from basis_bench.train.summary import (
    arms_table,
    load_arm,
    markdown_table,
    mean_interval,
    runs_table,
    step_bands,
    t_quantile,
)


@pytest.mark.parametrize(
    ("df", "table"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281), (30, 2.0423)],
)
def test_t_quantile_matches_the_tables(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)
    assert t_quantile(0.95, 1) == pytest.approx(6.3138, abs=1e-4)


def test_mean_interval_by_hand():
    # mean 0.6, sample sd 0.1, n = 3: half-width t_{0.975,2} * 0.1 / sqrt(3) = 0.248418
    mean, half = mean_interval([0.5, 0.6, 0.7])
    assert mean == pytest.approx(0.6) and half == pytest.approx(4.302653 * 0.1 / math.sqrt(3))
    assert mean_interval([0.4, math.nan]) == (0.4, pytest.approx(math.nan, nan_ok=True))
    assert all(math.isnan(v) for v in mean_interval([]))


def _run(path: Path, seed: int, evals: dict[int, float], steps: int = 4, **config) -> Path:
    """A synthetic finished run: 2 rollouts and 10 + 1 seconds a step, reward 0.1 * seed."""
    path.mkdir(parents=True)
    settings = {"estimator": "vanilla", "group_size": 8, "loss": "gpg", "lr": 1e-5}
    settings |= {"seed": seed, "steps": steps, "run_dir": str(path)} | config
    (path / "config.json").write_text(json.dumps(settings))
    append_jsonl(path / "log.jsonl", {"step": 0, "eval_accuracy": evals[0], "seconds": {"eval": 7}})
    for t in range(1, steps + 1):
        record = {"step": t, "rollouts": 2, "mean_reward": 0.1 * seed + 0.01 * t}
        record |= {"seconds": {"sample": 10.0, "update": 1}}
        append_jsonl(
            path / "log.jsonl", record | ({"eval_accuracy": evals[t]} if t in evals else {})
        )
    return path


def test_summary_tables_on_synthetic_runs(tmp_path):
    arm = tmp_path / "vanilla"
    # final, peak, drop, half (the evaluation at step 2 = steps // 2) by seed:
    _run(arm / "seed-0", 0, {0: 0.1, 2: 0.5, 4: 0.3})  # 0.3, 0.5, 0.2, 0.5
    _run(arm / "seed-1", 1, {0: 0.1, 2: 0.4, 4: 0.4})  # 0.4, 0.4, 0.0, 0.4
    _run(arm / "seed-2", 2, {0: 0.1, 2: 0.3, 4: 0.5})  # 0.5, 0.5, 0.0, 0.3
    single = _run(tmp_path / "grpo", 0, {0: 0.1, 4: 0.2}, estimator="grpo")  # no step-2 eval
    arms = [load_arm(arm), load_arm(single)]
    assert [p.name for p, _, _ in arms[0].runs] == ["seed-0", "seed-1", "seed-2"]
    runs = runs_table(arms, ["vanilla", "GRPO"])
    first = runs.row(0, named=True)
    assert (first["final"], first["peak"], first["half"]) == (0.3, 0.5, 0.5)
    assert first["drop"] == pytest.approx(0.2) and not first["collapsed"]  # 3 evaluations
    assert first["rollouts"] == 8 and first["wall_hours"] == pytest.approx((7 + 4 * 11) / 3600)
    assert runs.row(3, named=True)["half"] == 0.1  # the last evaluation at or before step 2
    assert [runs.row(i, named=True)["dip"] for i in range(3)] == pytest.approx([0.2, 0.0, 0.0])
    # a collapse the run recovers from: peak - final is 0, the dip 0.4 (0.5 -> 0.1 -> 0.5)
    back = _run(tmp_path / "back", 0, {0: 0.1, 1: 0.5, 2: 0.1, 3: 0.3, 4: 0.5})
    metrics = runs_table([load_arm(back)], ["back"]).row(0, named=True)
    assert metrics["drop"] == 0.0 and metrics["dip"] == pytest.approx(0.4)
    assert not metrics["collapsed"]
    # a fall that lasts: the last three evaluations' mean 0.1, the best level 0.5 (n = 10)
    fell = _run(tmp_path / "fell", 0, {0: 0.5, 1: 0.5, 2: 0.5, 3: 0.1, 4: 0.1, 5: 0.1}, steps=5)
    metrics = runs_table([load_arm(fell)], ["fell"]).row(0, named=True)
    assert metrics["decline"] == pytest.approx(0.4) and metrics["collapsed"]
    short = _run(tmp_path / "short", 0, {0: 0.1}, steps=1) / "config.json"
    short.write_text(short.read_text().replace('"steps": 1', '"steps": 4'))  # 1 of 4 steps done
    assert math.isnan(runs_table([load_arm(short.parent)], ["cut"]).row(0, named=True)["half"])

    table = arms_table(runs).row(0, named=True)
    t2 = 4.302653
    assert table["seeds"] == 3 and table["collapsed"] == 0 and table["last_step"] == 4
    assert table["final"] == pytest.approx(0.4)
    assert table["final_ci95"] == pytest.approx(t2 * 0.1 / math.sqrt(3), rel=1e-5)
    drops = np.array([0.2, 0.0, 0.0])
    assert table["drop_ci95"] == pytest.approx(t2 * drops.std(ddof=1) / math.sqrt(3), rel=1e-5)
    assert table["half"] == pytest.approx(0.4) and table["rollouts_ci95"] == 0.0
    lone = arms_table(runs).row(1, named=True)
    assert lone["seeds"] == 1 and lone["final"] == 0.2 and lone["final_ci95"] is None
    text = markdown_table(arms_table(runs))
    assert "| vanilla | 3 | 4 | 0.400 ± 0.248 |" in text
    assert "| GRPO | 1 | 4 | 0.200 |" in text and "| 0/3 |" in text


def test_seed_bands_average_over_the_seeds_that_logged_the_step(tmp_path):
    arm = tmp_path / "arm"
    _run(arm / "seed-0", 0, {0: 0.1, 2: 0.5, 4: 0.3})
    _run(arm / "seed-1", 1, {0: 0.1, 2: 0.4, 4: 0.4})
    _run(arm / "seed-3", 3, {0: 0.1, 2: 0.6})  # cut short: no step-4 evaluation
    band = step_bands(load_arm(arm), "eval_accuracy")
    assert band["step"].to_list() == [0, 2, 4] and band["n"].to_list() == [3, 3, 2]
    at2 = band.row(1, named=True)
    assert at2["mean"] == pytest.approx(0.5)
    assert at2["ci95"] == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert band.row(2, named=True)["ci95"] == pytest.approx(
        12.706205 * (0.1 / math.sqrt(2)) / math.sqrt(2)
    )
    # the reward band smooths each run first: rolling mean of 2 at step 2 is 0.1 s + 0.015
    reward = step_bands(load_arm(arm), "mean_reward", smooth=2).filter(pl.col("step") == 2)
    assert reward["mean"].item() == pytest.approx(0.1 * (0 + 1 + 3) / 3 + 0.015)


def test_an_arms_seeds_must_share_their_settings(tmp_path):
    arm = tmp_path / "arm"
    _run(arm / "seed-0", 0, {0: 0.1, 4: 0.3})
    _run(arm / "seed-1", 1, {0: 0.1, 4: 0.3}, lr=2e-5)
    with pytest.raises(InputError, match=r"seed-0 and seed-1 differ in lr \(1e-05 vs 2e-05\)"):
        load_arm(arm)


def _checkpoint(run_dir: Path, step: int, config) -> Path:
    torch = import_extra("hf", "torch")
    path = run_dir / "checkpoints" / f"step-{step:06d}"
    path.mkdir(parents=True)
    state = {  # what save_checkpoint writes, as resume checks it
        "step": step, "config": config_dict(config), "optimizer": {},
        "rng": {"torch": torch.get_rng_state(), "cuda": []},
    }  # fmt: skip
    torch.save(state, path / TRAINER_STATE)
    return path


def test_the_runner_skips_finished_seeds_resumes_interrupted_ones_and_starts_new_ones(tmp_path):
    config = make_config({"run_dir": str(tmp_path / "arm"), "steps": 4, "lr": 1e-5})
    finished, interrupted, new = (seed_config(config, s) for s in (0, 1, 2))
    assert finished.run_dir == str(tmp_path / "arm" / "seed-0") and finished.seed == 0
    _run(Path(finished.run_dir), 0, {0: 0.1, 4: 0.3}, lr=1e-5)
    (Path(finished.run_dir) / "config.json").write_text(
        json.dumps(config_dict(finished) | {"provenance": {}})
    )
    _checkpoint(Path(finished.run_dir), 4, finished)
    assert run_state(finished) == ("finished", None)
    assert run_state(dataclasses.replace(finished, steps=6))[0] == "resume"  # extended

    run = Path(interrupted.run_dir)
    _run(run, 1, {0: 0.1}, steps=3)  # logged 3 of 4 steps; checkpoints at 2, a partial at 3
    older, latest = _checkpoint(run, 1, interrupted), _checkpoint(run, 2, interrupted)
    (run / "checkpoints" / "step-000003.partial").mkdir()
    assert run_state(interrupted) == ("resume", latest)
    prune_checkpoints(run, keep=1)
    assert not older.exists() and latest.exists()

    assert run_state(new) == ("new", None)
    changed = dataclasses.replace(interrupted, lr=3e-5)
    with pytest.raises(InputError, match=r"written with lr = 1e-05, the configuration says 3e-05"):
        run_state(changed)


def test_a_run_stopped_before_its_first_checkpoint_restarts_under_its_own_settings(tmp_path):
    """A log but no complete checkpoint: nothing can be resumed and training refuses to
    append to the old log, so the runner clears it and starts again (it said "new" and
    then failed on "already holds a run")."""
    config = make_config({"run_dir": str(tmp_path / "arm"), "steps": 4, "lr": 1e-5})
    stopped = seed_config(config, 5)
    run = Path(stopped.run_dir)
    _run(run, 5, {0: 0.1}, steps=2, lr=1e-5)
    (run / "config.json").write_text(json.dumps(config_dict(stopped) | {"provenance": {}}))
    for name in ("rollouts", "eval", "checkpoints/step-000002.partial"):
        (run / name).mkdir(parents=True)
    (run / "rollouts" / "train-000001.parquet").write_bytes(b"x")
    (run / "prompts.parquet").write_bytes(b"kept")
    assert run_state(stopped) == ("restart", None)
    with pytest.raises(InputError, match=r"written with lr = 1e-05, the configuration says 3e-05"):
        run_state(dataclasses.replace(stopped, lr=3e-5))  # another configuration's partial run
    with pytest.raises(InputError, match=r"seed 5 \(its config\), not seed 6"):
        run_state(dataclasses.replace(stopped, seed=6))
    clear_partial_run(run)
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "prompts.parquet"]
    assert run_state(stopped) == ("new", None)


def test_seeds_options_are_checked_in_one_line(monkeypatch, capsys, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(f'run_dir = "{tmp_path / "arm"}"\n')
    train = ["train", "--config", str(config)]
    for args, needle in (
        (["--seeds", "0,x"], "--seeds: 'x' is not a seed"),
        (["--seeds", "1,1"], "--seeds: a seed is given twice"),
        (["--keep-checkpoints", "1"], "--keep-checkpoints applies to --seeds runs"),
    ):
        assert_one_line_error(run_main(monkeypatch, capsys, *train, *args), needle)
    assert not (tmp_path / "arm").exists()


def test_probe_settings_never_make_a_run_another_configuration(tmp_path):
    """A finished run and an interrupted one written without the value probe (a config.json
    and checkpoint that predate its settings) are skipped and resumed under a configuration
    that turns it on; an arm's seeds may differ in it; any other setting is still refused."""
    probed = ["probe_every=10", "probe_prompts=16", "probe_samples=12"]
    config = make_config({"run_dir": str(tmp_path / "arm"), "steps": 4}, probed)
    finished, interrupted = seed_config(config, 0), seed_config(config, 1)
    for one in (finished, interrupted):
        old = {k: v for k, v in config_dict(one).items() if not k.startswith("probe_")}
        old_config = dataclasses.replace(one, probe_every=0)
        _run(Path(one.run_dir), one.seed, {0: 0.1, 4: 0.3}, steps=4 if one is finished else 2)
        (Path(one.run_dir) / "config.json").write_text(json.dumps(old | {"provenance": {}}))
        _checkpoint(Path(one.run_dir), 4 if one is finished else 2, old_config)
    assert run_state(finished) == ("finished", None)
    assert run_state(interrupted)[0] == "resume"
    assert run_state(dataclasses.replace(finished, probe_every=5))[0] == "finished"
    with pytest.raises(InputError, match="written with lr"):
        run_state(dataclasses.replace(interrupted, lr=3e-5))

    arm = tmp_path / "study"
    _run(arm / "seed-0", 0, {0: 0.1, 4: 0.3})
    _run(arm / "seed-1", 1, {0: 0.1, 4: 0.3}, probe_every=10, probe_prompts=16)
    assert len(load_arm(arm).runs) == 2


def _with_probe(run: Path, errors: dict[int, float]) -> Path:
    """Add value-probe records (and their seconds) to a synthetic run's log."""
    records = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    (run / "log.jsonl").unlink()
    for record in records:
        if record["step"] in errors:
            record |= {"probe_value_error": errors[record["step"]], "probe_value_mse": 0.5}
            record["seconds"] = record["seconds"] | {"probe": 100.0}
        append_jsonl(run / "log.jsonl", record)
    return run


def test_value_error_band_table_and_figure_with_and_without_probe_records(tmp_path):
    from basis_bench.train.figures import plot_training

    arm = tmp_path / "track"
    _with_probe(_run(arm / "seed-0", 0, {0: 0.1, 4: 0.3}), {0: 0.02, 2: 0.04, 4: 0.06})
    _with_probe(_run(arm / "seed-1", 1, {0: 0.1, 4: 0.3}), {0: 0.04, 2: 0.02, 4: -0.01})
    _run(arm / "seed-2", 2, {0: 0.1, 4: 0.3})  # run before the probe existed: no records
    plain = _run(tmp_path / "vanilla", 0, {0: 0.1, 4: 0.2})
    band = step_bands(load_arm(arm), "probe_value_error")
    assert band["step"].to_list() == [0, 2, 4] and band["n"].to_list() == [2, 2, 2]
    assert band["mean"].to_list() == pytest.approx([0.03, 0.03, 0.025])
    runs = runs_table([load_arm(arm), load_arm(plain)], ["track", "vanilla"])
    assert runs["value_error"].to_list()[:2] == pytest.approx([0.04, 0.05 / 3])
    assert math.isnan(runs["value_error"][2]) and math.isnan(runs["value_error"][3])
    assert runs["wall_hours"][0] == pytest.approx((7 + 4 * 11) / 3600), "probe seconds left out"
    table = arms_table(runs)
    row = table.row(0, named=True)
    assert row["value_error"] == pytest.approx((0.04 + 0.05 / 3) / 2)
    assert row["value_error_ci95"] == pytest.approx(
        12.706205 * np.std([0.04, 0.05 / 3], ddof=1) / math.sqrt(2), rel=1e-5
    )
    assert table.row(1, named=True)["value_error"] is None
    text = markdown_table(table)
    assert "value error" in text.splitlines()[0] and "| 0.0283 ± 0.1482 |" in text

    written = {p.name for p in plot_training([arm, plain], tmp_path / "figs")}
    assert {"value_error.png", "value_error.pdf"} <= written
    summary = pl.read_csv(tmp_path / "figs" / "training_summary.csv")
    assert summary["probe_value_error"].drop_nulls().len() == 6
    written = {p.name for p in plot_training([plain], tmp_path / "figs")}
    assert not any(n.startswith("value_error") for n in written)
    assert not (tmp_path / "figs" / "value_error.png").exists(), "no stale figure kept"


# --------------------------------------------------------------------------- issue 44, class 4


def test_a_copied_seed_run_is_refused_not_skipped(tmp_path):
    """cp -a run/seed-0 run/seed-1, then train --seeds 0,1: "finished, skipping" for both."""
    import shutil

    config = make_config({"run_dir": str(tmp_path / "arm"), "steps": 4, "lr": 1e-5})
    first, second = seed_config(config, 0), seed_config(config, 1)
    _run(Path(first.run_dir), 0, {0: 0.1, 4: 0.3}, lr=1e-5)
    (Path(first.run_dir) / "config.json").write_text(
        json.dumps(config_dict(first) | {"provenance": {}}, default=str)
    )
    assert run_state(first) == ("finished", None)
    shutil.copytree(first.run_dir, second.run_dir)
    with pytest.raises(
        InputError, match=r"seed-1 holds a run of seed 0 \(its config\), not seed 1"
    ):
        run_state(second)


def test_train_figures_refuses_two_seeds_of_one_run(monkeypatch, capsys, tmp_path):
    """train-figures reported the copy as a second seed."""
    import shutil

    arm = tmp_path / "arm"
    _run(arm / "seed-0", 0, {0: 0.1, 4: 0.3})
    shutil.copytree(arm / "seed-0", arm / "seed-1")
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(arm), "--out", str(out))
    assert_one_line_error(result, "seed-1 holds a run of seed 0", "not seed 1 as its name says")
    assert not out.exists()
    (arm / "seed-1").rename(arm / "seed-x")  # not named by seed: two runs of one seed
    _run(arm / "seed-2", 0, {0: 0.2, 4: 0.4})
    result = run_main(monkeypatch, capsys, "train-figures", str(arm), "--out", str(out))
    assert_one_line_error(result, "seed-2 holds a run of seed 0")


def test_two_arms_of_one_folder_name_get_distinct_labels(monkeypatch, capsys, tmp_path):
    """train-figures a/run b/run gave two rows with the same label."""
    a = _run(tmp_path / "a" / "run", 0, {0: 0.1, 4: 0.3})
    b = _run(tmp_path / "b" / "run", 0, {0: 0.2, 4: 0.5})
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(a), str(b), "--out", str(out))
    assert result.code == 0, result.message
    labels = pl.read_csv(out / "training_summary.csv")["label"].unique().sort().to_list()
    assert len(labels) == 2 and labels[0].endswith("(a/run)") and labels[1].endswith("(b/run)")


@pytest.mark.parametrize("seeds", [[], ["--seeds", "0"]])
def test_train_notes_are_one_warning_line_with_and_without_seeds(tmp_path, seeds):
    """With --seeds, training's notes (held-out prompts left out, backend auto's hf) were
    Python's raw UserWarning: the source file's path and line, then the call's code."""
    from conftest import run_cli

    config = tmp_path / "c.toml"
    config.write_text(f'run_dir = "{tmp_path / "arm"}"\nrollouts_per_step = 1000000000\n')
    result = run_cli(["train", "--config", str(config), *seeds], timeout=300)
    said = [line for line in result.stderr.splitlines() if "held-out accuracy" in line]
    assert result.returncode == 2 and "rollouts_per_step at most" in result.stderr
    assert said and said[0].startswith("warning: held-out accuracy is over"), result.stderr
    assert "UserWarning" not in result.stderr and "setup.py" not in result.stderr


@pytest.mark.parametrize("how", ["a link", "the arm and its run"])
def test_train_figures_refuses_one_run_in_two_arms(monkeypatch, capsys, tmp_path, how):
    """arm2/seed-0 a link to arm/seed-0 (or `train-figures arm arm/seed-0`) drew one run as
    two arms: the given folders differed, the run folders inside them did not."""
    arm = tmp_path / "arm"
    _run(arm / "seed-0", 0, {0: 0.1, 4: 0.3})
    if how == "a link":
        (tmp_path / "arm2").mkdir()
        (tmp_path / "arm2" / "seed-0").symlink_to(arm / "seed-0")
        other = tmp_path / "arm2"
    else:
        other = arm / "seed-0"
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(arm), str(other), "--out", str(out))
    assert_one_line_error(result, "is given twice", "seed-0")
    assert not out.exists()
