"""Trajectory replay: a stateless estimator's trajectory equals independent per-step calls,
the SPO tracker's summary rows are unchanged, and evaluate writes trajectory.csv."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from basis_bench.bench.trajectory import (
    TrajectorySettings,
    replay_tracker,
    replay_trajectory,
    tracker_prompts,
)
from basis_bench.estimators import EstimatorInput, SpoTracker, TiltTable, get
from basis_bench.rollouts.store import reward_matrix


def _rollouts(p=20, ref_n=8, ck_n=12, seed=0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.1, 0.9, p)
    rows = []
    for policy, n, shift in (("reference", ref_n, 0.0), ("a", ck_n, 0.1), ("b", ck_n, 0.2)):
        r = (rng.random((p, n)) < np.clip(v + shift, 0, 1)[:, None]).astype(float)
        for i in range(p):
            for k in range(n):
                rows.append((f"x{i:02d}", policy, k, r[i, k]))
    return pl.DataFrame(
        rows, schema=["prompt_id", "policy", "sample_idx", "reward"], orient="row"
    ).with_columns(pl.col("sample_idx").cast(pl.Int32))


SETTINGS = TrajectorySettings(
    batch_size=6, repeats=3, epochs_per_checkpoint=2, group_size=2, oracle_n=4, ref_n=8, seed=1
)


def _per_step_reference(df, name, settings):
    """Redraw the replay's randomness and call the estimator step by step, repeat by repeat."""
    ids, _ = tracker_prompts(df, "reference", ["a", "b"])
    cache = reward_matrix(df, "reference", ids)[:, : settings.ref_n]
    table = TiltTable.from_cache(cache, None, settings.prior, list(ids))
    est = get(name)
    rng = np.random.default_rng(settings.seed)
    p, b = len(ids), settings.batch_size
    per_epoch = (p // b) * b
    from basis_bench.bench.replay import draw_rollouts

    sq = []
    for ck in ("a", "b"):
        rewards_all = reward_matrix(df, ck, ids)
        oracle = rewards_all[:, : settings.oracle_n].mean(axis=1)
        pool = rewards_all[:, settings.oracle_n :]
        count = np.isfinite(pool).sum(axis=1)
        for _ in range(settings.epochs_per_checkpoint):
            index = np.argsort(rng.random((settings.repeats, p)), axis=1)[:, :per_epoch]
            cols = draw_rollouts(rng, count[index], settings.group_size, pool.shape[1])
            rewards = pool[index[..., None], cols]
            epoch = np.empty((settings.repeats, per_epoch))
            for rep in range(settings.repeats):
                for start in range(0, per_epoch, b):
                    c = index[rep, start : start + b]
                    g = est.rollouts_per_prompt(settings.group_size)
                    r = rewards[rep, start : start + b, :g]
                    v, var = table.gather(c)
                    base = est(EstimatorInput(r, v, var, table.betas))
                    epoch[rep, start : start + b] = ((base - oracle[c, None]) ** 2).mean(-1)
            sq.append(epoch.sum(axis=1) / per_epoch)
    return np.array(sq)  # (epochs, repeats)


@pytest.mark.parametrize("name", ["basis", "grpo", "reinforce_pp"])
def test_stateless_trajectory_equals_independent_per_step_calls(name):
    df = _rollouts()
    table, curves = replay_trajectory(
        df, "reference", ["a", "b"], ["basis", "grpo", "reinforce_pp"], SETTINGS
    )
    rows = table.filter((pl.col("scope") == "epoch") & (pl.col("estimator") == name))
    want = _per_step_reference(df, name, SETTINGS).mean(axis=1)
    np.testing.assert_allclose(rows["mse"].to_numpy(), want, rtol=1e-12, atol=1e-15)
    assert rows["epoch"].to_list() == [1, 2, 3, 4]
    assert len(curves[name]) == 4 * (20 // 6)


def test_spo_tracker_summary_rows_are_the_tracker_class_replayed():
    """replay_tracker (now on the shared step interface) equals a loop over SpoTracker objects."""
    df = _rollouts(seed=2)
    got = replay_tracker(df, "reference", ["a", "b"], batch_size=5, repeats=2, oracle_n=4, ref_n=8)
    ids, _ = tracker_prompts(df, "reference", ["a", "b"])
    cache = reward_matrix(df, "reference", ids)[:, :8]
    trackers = [SpoTracker(list(ids), cache) for _ in range(2)]
    rng = np.random.default_rng(0)
    p = len(ids)
    for k, ck in enumerate(("a", "b")):
        rw = reward_matrix(df, ck, ids)
        oracle, pool = rw[:, :4].mean(axis=1), rw[:, 4:]
        count = np.isfinite(pool).sum(axis=1)
        index = np.argsort(rng.random((2, p)), axis=1)[:, :p]
        col = np.floor(rng.random(index.shape) * count[index]).astype(np.int64)
        r = pool[index, col]
        sq = [
            np.concatenate([
                (trackers[j]([ids[i] for i in index[j, s : s + 5]], r[j, s : s + 5])
                 - oracle[index[j, s : s + 5]]) ** 2
                for s in range(0, p, 5)
            ]).mean()
            for j in range(2)
        ]  # fmt: skip
        assert got["mse"][k] == pytest.approx(np.mean(sq), rel=1e-12)


def test_stateful_estimators_carry_state_and_never_return_zero_or_one():
    df = _rollouts(seed=3)
    settings = TrajectorySettings(
        batch_size=5, repeats=4, epochs_per_checkpoint=3, oracle_n=4, ref_n=8, seed=0
    )
    table, _ = replay_trajectory(df, "reference", ["a", "b"], ["basis_memory", "offline"], settings)
    mem = table.filter(pl.col("estimator") == "basis_memory")
    assert mem["extreme_rate"].max() == 0.0
    first = table.filter((pl.col("scope") == "epoch") & (pl.col("epoch") == 1))
    # On the first visit the memory has no history: no better than its own prior can be.
    assert set(first["estimator"]) == {"basis_memory", "offline"}
    ck = table.filter(pl.col("scope") == "checkpoint")
    assert ck.height == 4 and ck["epoch"].null_count() == 4


def test_evaluate_writes_trajectory_csv_and_keeps_stateful_out_of_one_step_tables(tmp_path):
    from basis_bench.bench.config import EvaluateConfig
    from basis_bench.bench.run import evaluate
    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    root = tmp_path / "data"
    simulate(SimulationConfig(n_prompts=40, reference_n=16, checkpoint_n=24), root)
    cfg = EvaluateConfig(
        rollouts=str(root), estimators=("basis", "grpo", "basis_memory", "spo_tracker"),
        batch_size=8, repeats=4, oracle_n=8, ref_n=16, trajectory_epochs=2,
        write_estimates=False,
    )  # fmt: skip
    res = evaluate(cfg, tmp_path / "out")
    summary = pl.read_csv(tmp_path / "out" / "summary.csv")
    assert "basis_memory" not in set(summary["estimator"])
    traj = pl.read_csv(tmp_path / "out" / "trajectory.csv")
    assert {"basis", "grpo", "basis_memory", "spo_tracker"} == set(traj["estimator"])
    assert res.run["trajectory"]["epochs_per_checkpoint"] == 2
