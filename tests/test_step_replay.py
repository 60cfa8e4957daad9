"""The step replay: counter-based draws, cross-fitted pools, the log-odds mixture, the
rollout budget, and no pool floor (a memory estimator on a standing policy goes below
v(1-v)/16, where the epoch replay's 16-sample pool stops it)."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from basis_bench.errors import InputError
from basis_bench.evaluation import replay_plan, step_replay
from basis_bench.evaluation.counter_random import permute, uniforms
from basis_bench.evaluation.replay_plan import ReplayPlan
from basis_bench.evaluation.step_replay import (
    StepSchedule,
    Timeline,
    VisitSchedule,
    cross_fit,
    mixture_weight,
    replay_steps,
)
from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory
from basis_bench.rollouts.training_record import (
    TRAINING_FILE,
    TrainingRecord,
    checkpoint_steps,
    part_steps,
    read_training_record,
    record_step,
    training_record,
)


def _frame(values: dict[str, np.ndarray], samples: dict[str, int], seed: int = 0) -> pl.DataFrame:
    """Bernoulli rewards: policy -> per-prompt values, and samples per prompt."""
    rng = np.random.default_rng(seed)
    parts = []
    for policy, v in values.items():
        n = samples[policy]
        r = (rng.random((len(v), n)) < v[:, None]).astype(float)
        parts.append(
            pl.DataFrame({
                "prompt_id": np.repeat([f"x{i:03d}" for i in range(len(v))], n),
                "policy": policy,
                "sample_idx": np.tile(np.arange(n), len(v)).astype(np.int32),
                "reward": r.ravel(),
            })
        )  # fmt: skip
    return pl.concat(parts)


def test_permute_is_a_bijection_for_every_size_and_key() -> None:
    for n in (1, 2, 3, 7, 16, 17, 100, 255, 256, 257):
        for key in range(3):
            got = permute(np.arange(n), n, 5, key)
            assert sorted(got.tolist()) == list(range(n))
    # sizes varying per element: each row of a prompt's positions is its own bijection
    n = np.array([3, 9, 1, 40])[:, None]
    pos = np.arange(40)[None, :] % n
    got = permute(pos, n, 1, np.arange(4)[:, None])
    for i, size in enumerate(n.ravel()):
        assert sorted(set(got[i].tolist())) == list(range(size))


def test_uniforms_are_uniform_and_a_function_of_their_keys() -> None:
    u = uniforms(3, np.arange(200_000))
    assert abs(u.mean() - 0.5) < 0.003 and abs(u.var() - 1 / 12) < 0.002
    # any subset of keys reads the same numbers as the whole (memory passes change nothing)
    whole = uniforms(3, np.arange(10)[:, None], np.arange(7)[None, :])
    assert np.array_equal(whole[4:6], uniforms(3, np.arange(4, 6)[:, None], np.arange(7)[None, :]))
    assert not np.array_equal(whole, uniforms(4, np.arange(10)[:, None], np.arange(7)[None, :]))


def test_cross_fit_pool_and_oracle_are_disjoint_and_cover_the_samples() -> None:
    rng = np.random.default_rng(0)
    rewards = rng.random((5, 30))
    rewards[2, 25:] = np.nan  # a prompt with fewer samples
    folds = cross_fit(rewards, 3, seed=0, index=0, name="c")
    for i in range(5):
        row = rewards[i][np.isfinite(rewards[i])]
        pools = [folds.pool[f, i, : folds.pool_size[f, i]] for f in range(3)]
        assert sorted(np.concatenate(pools).tolist()) == sorted(row.tolist())
        assert max(folds.pool_size[:, i]) - min(folds.pool_size[:, i]) <= 1
        for f in range(3):
            rest = np.concatenate([pools[g] for g in range(3) if g != f])
            assert folds.oracle[f, i] == pytest.approx(rest.mean())
            assert folds.noise[f, i] == pytest.approx(rest.var(ddof=1) / rest.size)


def test_mixture_weight_follows_the_log_odds_path() -> None:
    a, b = np.array([0.1, 0.8, 0.3, 0.5]), np.array([0.9, 0.2, 0.3, 0.7])
    for w in (0.0, 0.25, 0.5, 1.0):
        m = mixture_weight(a, b, w, 1e-6)
        logit = (1 - w) * np.log(a / (1 - a)) + w * np.log(b / (1 - b))
        moved = a != b
        want = 1 / (1 + np.exp(-logit))
        assert np.allclose(((1 - m) * a + m * b)[moved], want[moved])
        assert np.all((m >= 0) & (m <= 1))
    assert np.allclose(mixture_weight(a, b, 1.0, 1e-6)[a != b], 1.0)


def test_timeline_interpolates_between_checkpoint_steps() -> None:
    t = Timeline.build([5, 15, 40], standing=2)
    assert t.steps[0] == 5 and t.steps[-1] == 42
    at10 = int(np.flatnonzero(t.steps == 10)[0])
    assert t.interval[at10] == 0 and t.weight[at10] == pytest.approx(0.5)
    assert t.interval[-1] == 2 and t.weight[-1] == 0.0
    with pytest.raises(InputError, match="increasing training steps"):
        Timeline.build([5, 5], 0)


def test_a_standing_policy_has_no_pool_floor() -> None:
    """64 visits of every prompt of a standing policy: basis_memory's noise-corrected MSE
    falls below the mean v(1-v)/16 the epoch replay's 16-sample pool cannot pass."""
    rng = np.random.default_rng(1)
    p = 32
    v = rng.uniform(0.2, 0.8, p)
    df = _frame({"reference": v, "c": v}, {"reference": 64, "c": 272}, seed=2)
    floor = float(np.mean(v * (1 - v)) / 16)
    plan = ReplayPlan(repeats=8, ref_n=64)
    steps = StepSchedule(batch_size=p, folds=2, standing_steps=63)
    table, curves = replay_steps(df, "reference", ["c"], [0], ["basis_memory"], plan, steps)
    late = table.filter(pl.col("scope") == "step").tail(8)["mse_noise_corrected"].mean()
    assert late < floor
    assert curves["basis_memory"][-8:].mean() < curves["basis_memory"][:4].mean()
    epochs = EpochSchedule(batch_size=p, epochs_per_checkpoint=64, oracle_n=256)
    old, _ = replay_trajectory(df, "reference", ["c"], ["basis_memory"], plan, epochs)
    stuck = old.filter(pl.col("scope") == "epoch").tail(8)["mse_noise_corrected"].mean()
    assert stuck > floor / 2  # the 16-sample pool: about v(1-v)/16, never far below


def test_a_budget_makes_every_estimator_spend_the_same_rollouts() -> None:
    rng = np.random.default_rng(3)
    v0 = rng.uniform(0.1, 0.9, 40)
    df = _frame(
        {"reference": v0, "a": np.clip(v0 + 0.2, 0, 1), "b": np.clip(v0 + 0.3, 0, 1)},
        {"reference": 16, "a": 64, "b": 64},
    )
    plan, s = ReplayPlan(repeats=4, ref_n=16, group_size=8), StepSchedule(rollouts_per_step=32)
    names = ["grpo", "basis", "vanilla"]
    table, _ = replay_steps(df, "reference", ["a", "b"], [0, 10], names, plan, s)
    whole = table.filter(pl.col("scope") == "trajectory")
    by = {r["estimator"]: r for r in whole.iter_rows(named=True)}
    assert by["grpo"]["prompts_per_step"] == 4 and by["basis"]["prompts_per_step"] == 32
    assert by["grpo"]["rollouts_spent"] == by["basis"]["rollouts_spent"] == 11 * 32
    # the zero baseline's MSE is the mean squared oracle value over its visits
    assert by["vanilla"]["mse"] > 0
    with pytest.raises(InputError, match="visits 0 prompt"):
        replay_steps(df, "reference", ["a", "b"], [0, 10], ["grpo"],
                     ReplayPlan(repeats=2, ref_n=16), StepSchedule(rollouts_per_step=4))  # fmt: skip


def test_a_budget_beyond_the_prompts_is_several_batches_a_step() -> None:
    """B = 64 visits of P = 48 prompts: a pass over every prompt, then 16 of an epoch, each
    batch of distinct prompts; over 3 steps every prompt is visited exactly 4 = 3 x 64 / 48
    times. B = 96: two whole passes. B <= P stays one batch a step."""
    r_ids = np.arange(5)
    for batch, sizes in ((64, [48, 16]), (96, [48, 48]), (16, [16])):
        schedule = VisitSchedule(batch, 48, r_ids, seed=7)
        counts = np.zeros((5, 48), dtype=int)
        for u in range(3):
            batches = schedule.batches(u)
            assert [cols.shape for _, cols in batches] == [(5, n) for n in sizes]
            assert len({key for key, _ in batches}) == len(batches)  # each its own draws
            for _, cols in batches:
                assert all(len(set(row)) == len(row) for row in cols.tolist())
                np.add.at(counts, (r_ids[:, None], cols), 1)
        assert (counts == 3 * batch // 48).all()


def test_a_one_rollout_budget_beyond_the_prompts_spends_what_grpo_spends() -> None:
    """R = 64 on 24 prompts: GRPO(8) visits 8 prompts a step, a one-rollout estimator 64
    (every prompt 64 / 24 times a step, in 3 batches); both spend 64 rollouts a step, and
    basis_track (which refuses a prompt twice in one batch) runs."""
    rng = np.random.default_rng(5)
    v0 = rng.uniform(0.1, 0.9, 24)
    df = _frame({"reference": v0, "a": v0, "b": np.clip(v0 + 0.2, 0, 1)},
                {"reference": 16, "a": 64, "b": 64})  # fmt: skip
    plan, s = ReplayPlan(repeats=3, ref_n=16, group_size=8), StepSchedule(rollouts_per_step=64)
    names = ["grpo", "basis_memory", "basis_track"]
    table, _ = replay_steps(df, "reference", ["a", "b"], [0, 4], names, plan, s)
    whole = {
        r["estimator"]: r
        for r in table.filter(pl.col("scope") == "trajectory").iter_rows(named=True)
    }
    assert {n: whole[n]["rollouts_spent"] for n in names} == dict.fromkeys(names, 5 * 64)
    assert (
        whole["grpo"]["prompts_per_step"] == 8 and whole["basis_memory"]["prompts_per_step"] == 64
    )
    step = table.filter((pl.col("scope") == "step") & (pl.col("estimator") == "basis_track"))
    assert step["visits_per_prompt"].to_list() == pytest.approx([64 / 24] * 5)
    assert step["rollouts_spent"].to_list() == [64 * (u + 1) for u in range(5)]
    assert step["mse"].is_finite().all() and (table["pool_reuse"] == 0).all()


def test_draws_follow_the_mixture_policy() -> None:
    """Checkpoint a answers nothing, b everything: halfway the rollouts are b's with the
    log-odds path's probability, and the oracle is that mixture's value."""
    p = 10
    df = _frame(
        {"reference": np.full(p, 0.5), "a": np.zeros(p), "b": np.ones(p)},
        {"reference": 8, "a": 64, "b": 64},
    )
    plan, s = ReplayPlan(repeats=400, ref_n=8), StepSchedule(batch_size=p, folds=2)
    names = ["vanilla", "reinforce_pp"]
    table, _ = replay_steps(df, "reference", ["a", "b"], [0, 2], names, plan, s)
    mid = {
        r["estimator"]: r["mse"]
        for r in table.filter((pl.col("scope") == "step") & (pl.col("step") == 1)).iter_rows(
            named=True
        )
    }
    m = float(mixture_weight(np.array([0.0]), np.array([1.0]), 0.5, 0.5 / 64)[0])
    assert m == pytest.approx(0.5)
    # vanilla's baseline is 0: its MSE is the mean squared oracle, m^2
    assert mid["vanilla"] == pytest.approx(m**2)
    # REINFORCE++'s batch mean of p rollouts, each b's with probability m: variance m(1-m)/p
    assert mid["reinforce_pp"] == pytest.approx(m * (1 - m) / p, rel=0.12)


def test_memory_passes_change_no_number(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    v = rng.uniform(0.1, 0.9, 24)
    df = _frame({"reference": v, "a": v, "b": np.clip(v + 0.2, 0, 1)},
                {"reference": 16, "a": 40, "b": 40})  # fmt: skip
    plan, s = ReplayPlan(repeats=6, ref_n=16, group_size=4), StepSchedule(batch_size=8)
    names = ["basis_memory", "grpo", "basis"]
    whole, _ = replay_steps(df, "reference", ["a", "b"], [0, 6], names, plan, s)
    monkeypatch.setattr(replay_plan, "STREAM_BYTES", 1)  # one stream a pass
    split, _ = replay_steps(df, "reference", ["a", "b"], [0, 6], names, plan, s)
    assert_frame_equal(whole, split)


def test_estimators_in_sets_of_passes_change_no_number(monkeypatch: pytest.MonkeyPatch) -> None:
    """basis_track's state (8 KiB a prompt) in passes of one stream, the others' in one
    pass, each set drawing the same visits: the table of all in one pass (the visits'
    noise and reuse counted once), up to rounding order."""
    rng = np.random.default_rng(4)
    v = rng.uniform(0.1, 0.9, 24)
    df = _frame({"reference": v, "a": v, "b": np.clip(v + 0.2, 0, 1)},
                {"reference": 16, "a": 40, "b": 40})  # fmt: skip
    plan, s = ReplayPlan(repeats=6, ref_n=16, group_size=4), StepSchedule(batch_size=8)
    names = ["basis_memory", "grpo", "basis", "basis_track"]
    whole, _ = replay_steps(df, "reference", ["a", "b"], [0, 6], names, plan, s)
    made = []

    def spy(*args, **kwargs):
        made.append(replay_plan.stream_sets(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(step_replay, "stream_sets", spy)
    monkeypatch.setattr(replay_plan, "STREAM_BYTES", 300_000)  # 1 stream of basis_track a pass
    split, _ = replay_steps(df, "reference", ["a", "b"], [0, 6], names, plan, s)
    assert [[g for _, g in sets] for sets in made] == [[6, 1]]  # B = 8 for all: one group
    assert_frame_equal(whole, split, rel_tol=1e-12)


def test_data_without_steps_in_its_parts_reads_training_json_alone() -> None:
    from basis_bench.evaluation.dataset import DEFAULT_DATASET

    assert part_steps(DEFAULT_DATASET) == {}
    assert training_record(DEFAULT_DATASET) == read_training_record(DEFAULT_DATASET)


def test_training_record_reads_writes_and_refuses(tmp_path) -> None:
    assert read_training_record(tmp_path) is None
    record_step(tmp_path, "late", 40)
    rec = record_step(tmp_path, "early", 5)
    assert read_training_record(tmp_path) == rec
    assert checkpoint_steps(rec, ["early", "late"]) == [5, 40]
    assert checkpoint_steps(rec, ["early", "middle"]) is None
    (tmp_path / TRAINING_FILE).write_text(json.dumps({"steps": {"a": -1}}))
    with pytest.raises(InputError, match="integer >= 0"):
        read_training_record(tmp_path)
    (tmp_path / TRAINING_FILE).write_text("[" * 100_000)
    with pytest.raises(InputError, match="not a readable training record"):
        read_training_record(tmp_path)


def test_evaluate_on_the_default_data_spends_equal_budgets_at_training_steps(
    tmp_path, monkeypatch, capsys
) -> None:
    from conftest import run_main

    from basis_bench.evaluation import schedule as schedule_module

    reads = []  # the schedule is resolved once a run: the pre-check, the replay and run.json share it

    def counted(root):
        reads.append(root)
        return training_record(root)

    monkeypatch.setattr(schedule_module, "training_record", counted)
    out = tmp_path / "res"
    run = run_main(monkeypatch, capsys, "evaluate", "--estimators", "grpo,basis_memory",
                   "--repeats", "3", "--rollouts-per-step", "64", "--no-estimates",
                   "--out", str(out))  # fmt: skip
    assert run.code == 0, run.message
    traj = pl.read_csv(out / "trajectory.csv")
    whole = traj.filter(pl.col("scope") == "trajectory")
    assert set(whole["rollouts_spent"]) == {36 * 64}  # steps 5..40 of the training run
    assert dict(zip(whole["estimator"], whole["prompts_per_step"], strict=True)) == {
        "grpo": 8, "basis_memory": 64,
    }  # fmt: skip
    assert set(traj["schedule"]) == {"steps, budget 64 rollouts a step"}
    record = json.loads((out / "run.json").read_text())["trajectory"]
    assert record["steps"] == {"early": 5, "middle": 15, "late": 40}
    assert len(reads) == 1
    printed = " ".join(run.out.split())  # the table: prompts x G, rollouts spent, steps
    assert "8 x 8 2,304" in printed and "64 x 1 2,304" in printed and "whole" in printed
    assert "5-14" in printed and "…" not in run.out


def test_the_schedule_follows_the_options_and_refuses_what_it_would_not_use(
    tmp_path, monkeypatch, capsys
) -> None:
    from conftest import assert_one_line_error, run_main

    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    root = tmp_path / "sim"
    simulate(SimulationConfig(n_prompts=24, ref_n=16, checkpoint_n=24), root)
    common = ["evaluate", "--rollouts", str(root), "--estimators", "grpo", "--repeats", "2",
              "--ref-n", "16", "--oracle-n", "8", "--batch-size", "8", "--no-estimates"]  # fmt: skip
    run = run_main(monkeypatch, capsys, *common, "--trajectory-schedule", "steps",
                   "--out", str(tmp_path / "a"))  # fmt: skip
    assert_one_line_error(run, "training.json", "--step")
    run = run_main(monkeypatch, capsys, *common, "--trajectory-schedule", "epochs",
                   "--rollouts-per-step", "16", "--out", str(tmp_path / "b"))  # fmt: skip
    assert_one_line_error(run, "--rollouts-per-step", "step schedule")
    # no training record: auto is the epoch schedule, as before
    run = run_main(monkeypatch, capsys, *common, "--out", str(tmp_path / "c"))
    assert run.code == 0 and set(pl.read_csv(tmp_path / "c" / "trajectory.csv")["schedule"]) == {
        "epochs"
    }
    record_step(root, "early", 0)
    record_step(root, "middle", 10)
    record_step(root, "late", 20)
    run = run_main(monkeypatch, capsys, *common, "--out", str(tmp_path / "d"))
    assert run.code == 0
    assert "steps" in pl.read_csv(tmp_path / "d" / "trajectory.csv")["schedule"][0]
    # an epoch option asks for the epoch schedule; with a step option too, one is unused
    run = run_main(monkeypatch, capsys, *common, "--trajectory-epochs", "2",
                   "--out", str(tmp_path / "e"))  # fmt: skip
    assert run.code == 0
    assert set(pl.read_csv(tmp_path / "e" / "trajectory.csv")["schedule"]) == {"epochs"}
    run = run_main(monkeypatch, capsys, *common, "--trajectory-epochs", "2", "--folds", "3",
                   "--out", str(tmp_path / "f"))  # fmt: skip
    assert_one_line_error(run, "--folds", "step schedule")


def test_import_step_records_the_policy_in_the_training_record(
    tmp_path, monkeypatch, capsys
) -> None:
    from conftest import assert_one_line_error, run_main
    from typer.testing import CliRunner

    from basis_bench.cli import app

    src = tmp_path / "c.csv"
    src.write_text("prompt_id,n,n_correct\np1,8,3\np2,8,5\n", encoding="utf-8")
    runner = CliRunner()
    for policy, step in (("ref", 0), ("ckpt", 30)):
        args = ["import", "counts", str(src), "--policy", policy, "--out", str(tmp_path / "ds")]
        result = runner.invoke(app, [*args, "--step", str(step)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    record = read_training_record(tmp_path / "ds")
    assert record is not None and record.steps == {"ref": 0, "ckpt": 30}
    # the step travels with the rollouts too, and the two agree
    assert part_steps(tmp_path / "ds") == {"ref": 0, "ckpt": 30}
    assert training_record(tmp_path / "ds") == record
    # training.json lost: the parts still give every step
    (tmp_path / "ds" / TRAINING_FILE).unlink()
    assert training_record(tmp_path / "ds") == TrainingRecord({"ref": 0, "ckpt": 30})
    # training.json edited to disagree: a one-line refusal, before any replay
    (tmp_path / "ds" / TRAINING_FILE).write_text(json.dumps({"steps": {"ckpt": 20}}))
    with pytest.raises(
        InputError, match="'ckpt' at training step 20, its rollouts' metadata at step 30"
    ):
        training_record(tmp_path / "ds")
    run = run_main(monkeypatch, capsys, "evaluate", "--rollouts", str(tmp_path / "ds"), "--reference", "ref",
                   "--out", str(tmp_path / "res"))  # fmt: skip
    assert_one_line_error(run, "training.json", "step 20", "step 30")
    bad = runner.invoke(app, ["import", "counts", str(src), "--policy", "x", "--out",
                              str(tmp_path / "ds"), "--step", "-1"])  # fmt: skip
    assert bad.exit_code == 2
