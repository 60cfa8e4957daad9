"""Trajectory replay: a stateless estimator's trajectory equals independent per-step calls,
the SPO tracker's rows equal a loop over tracker objects, and evaluate writes trajectory.csv."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from basis_bench.errors import InputError
from basis_bench.estimators import EstimatorInput, SpoTracker, TiltTable, get, make_step_estimator
from basis_bench.evaluation import replay_plan, trajectory
from basis_bench.evaluation.replay_plan import ReplayPlan, shared_prompts
from basis_bench.evaluation.trajectory import EpochSchedule, replay_trajectory
from basis_bench.rollouts.store import reward_matrix


def _frame(rows) -> pl.DataFrame:
    """(prompt_id, policy, sample_idx, reward) tuples as a frame in the store's schema."""
    return pl.DataFrame(
        rows, schema=["prompt_id", "policy", "sample_idx", "reward"], orient="row"
    ).with_columns(pl.col("sample_idx").cast(pl.Int32))


def _rollouts(p=20, ref_n=8, ck_n=12, seed=0) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    v = rng.uniform(0.1, 0.9, p)
    rows = []
    for policy, n, shift in (("reference", ref_n, 0.0), ("a", ck_n, 0.1), ("b", ck_n, 0.2)):
        r = (rng.random((p, n)) < np.clip(v + shift, 0, 1)[:, None]).astype(float)
        for i in range(p):
            for k in range(n):
                rows.append((f"x{i:02d}", policy, k, r[i, k]))
    return _frame(rows)


PLAN = ReplayPlan(repeats=3, group_size=2, ref_n=8, seed=1)
EPOCHS = EpochSchedule(batch_size=6, epochs_per_checkpoint=2, oracle_n=4)


def _per_step_reference(df, name, plan, settings):
    """Redraw the replay's randomness and call the estimator step by step, repeat by repeat."""
    ids, _ = shared_prompts(df, "reference", ["a", "b"])
    cache = reward_matrix(df, "reference", ids)[:, : plan.ref_n]
    table = TiltTable.from_cache(cache, None, plan.prior, list(ids))
    est = get(name)
    rng = np.random.default_rng(plan.seed)
    p, b = len(ids), settings.batch_size
    per_epoch = (p // b) * b
    from basis_bench.evaluation.replay import draw_rollouts

    sq = []
    for ck in ("a", "b"):
        rewards_all = reward_matrix(df, ck, ids)
        oracle = rewards_all[:, : settings.oracle_n].mean(axis=1)
        pool = rewards_all[:, settings.oracle_n :]
        count = np.isfinite(pool).sum(axis=1)
        for _ in range(settings.epochs_per_checkpoint):
            index = np.argsort(rng.random((plan.repeats, p)), axis=1)[:, :per_epoch]
            cols = draw_rollouts(rng, count[index], plan.group_size, pool.shape[1])
            rewards = pool[index[..., None], cols]
            epoch = np.empty((plan.repeats, per_epoch))
            for rep in range(plan.repeats):
                for start in range(0, per_epoch, b):
                    c = index[rep, start : start + b]
                    g = est.rollouts_per_prompt(plan.group_size)
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
        df, "reference", ["a", "b"], ["basis", "grpo", "reinforce_pp"], PLAN, EPOCHS
    )
    rows = table.filter((pl.col("scope") == "epoch") & (pl.col("estimator") == name))
    want = _per_step_reference(df, name, PLAN, EPOCHS).mean(axis=1)
    np.testing.assert_allclose(rows["mse"].to_numpy(), want, rtol=1e-12, atol=1e-15)
    assert rows["epoch"].to_list() == [1, 2, 3, 4]
    assert len(curves[name]) == 4 * (20 // 6)


def test_spo_tracker_rows_are_the_tracker_replayed_step_by_step():
    """The tracker's trajectory rows equal a loop over SpoTracker step estimators."""
    df = _rollouts(seed=2)
    plan, epochs = ReplayPlan(repeats=2, ref_n=8), EpochSchedule(batch_size=5, oracle_n=4)
    table, _ = replay_trajectory(df, "reference", ["a", "b"], ["spo_tracker"], plan, epochs)
    got = table.filter(pl.col("scope") == "checkpoint")
    ids, _ = shared_prompts(df, "reference", ["a", "b"])
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
                (trackers[j]([ids[i] for i in index[j, s : s + 5]], r[j, s : s + 5]).baselines
                 - oracle[index[j, s : s + 5]]) ** 2
                for s in range(0, p, 5)
            ]).mean()
            for j in range(2)
        ]  # fmt: skip
        assert got["mse"][k] == pytest.approx(np.mean(sq), rel=1e-12)


def test_stateful_estimators_carry_state_and_never_return_zero_or_one():
    df = _rollouts(seed=3)
    plan = ReplayPlan(repeats=4, ref_n=8, seed=0)
    epochs = EpochSchedule(batch_size=5, epochs_per_checkpoint=3, oracle_n=4)
    names = ["basis_memory", "offline"]
    table, _ = replay_trajectory(df, "reference", ["a", "b"], names, plan, epochs)
    mem = table.filter(pl.col("estimator") == "basis_memory")
    assert mem["extreme_rate"].max() == 0.0
    first = table.filter((pl.col("scope") == "epoch") & (pl.col("epoch") == 1))
    # On the first visit the memory has no history: no better than its own prior can be.
    assert set(first["estimator"]) == {"basis_memory", "offline"}
    ck = table.filter(pl.col("scope") == "checkpoint")
    assert ck.height == 4 and ck["epoch"].null_count() == 4


def test_evaluate_writes_trajectory_csv_and_keeps_stateful_out_of_one_step_tables(tmp_path):
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.run import evaluate
    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    root = tmp_path / "data"
    simulate(SimulationConfig(n_prompts=40, ref_n=16, checkpoint_n=24), root)
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
    assert res.run.trajectory["epochs_per_checkpoint"] == 2


def _switching_rollouts(p=20, n=12, seed=4) -> pl.DataFrame:
    """Checkpoint a never solves a prompt, b always does: a mixture with share w of b has
    value w on every prompt, and its oracle has no noise."""
    rng = np.random.default_rng(seed)
    rows = [
        (f"x{i:02d}", "reference", k, float(rng.random() < 0.5)) for i in range(p) for k in range(8)
    ]
    rows += [
        (f"x{i:02d}", ck, k, r)
        for ck, r in (("a", 0.0), ("b", 1.0))
        for i in range(p)
        for k in range(n)
    ]
    return _frame(rows)


def test_blend_is_the_mixture_policy_and_its_oracle():
    """Blending a (all 0) into b (all 1) over E epochs: in epoch e the policy is the mixture with
    share w = e / E of b. The reference mean's error is (V^_ref - w)^2 exactly (the oracle is
    the mixture's value); GRPO(G)'s estimate is Binomial(G, w) / G, MSE w (1 - w) / G in
    expectation (each rollout from b with probability w, independently)."""
    df = _switching_rollouts()
    epochs, g = 4, 4
    plan = ReplayPlan(repeats=3000, group_size=g, ref_n=8, seed=2)
    settings = EpochSchedule(batch_size=5, epochs_per_checkpoint=epochs, oracle_n=4, blend=True)
    names = ["reference_mean", "grpo"]
    table, _ = replay_trajectory(df, "reference", ["a", "b"], names, plan, settings)
    rows = table.filter(pl.col("scope") == "epoch").sort("epoch")
    w = np.r_[np.arange(epochs) / epochs, np.zeros(epochs)]  # b is last: no next, it stays
    want_oracle = np.r_[w[:epochs], np.ones(epochs)]
    assert rows.filter(pl.col("estimator") == "grpo")["next_share"].to_list() == list(w)
    ids, _ = shared_prompts(df, "reference", ["a", "b"])
    k = reward_matrix(df, "reference", ids).sum(axis=1)
    v_ref = (k + 0.5) / (8 + 1)  # the smoothed reference rate (Jeffreys)
    ref = rows.filter(pl.col("estimator") == "reference_mean")
    np.testing.assert_allclose(
        ref["mse"].to_numpy(), [np.mean((v_ref - o) ** 2) for o in want_oracle], rtol=1e-12
    )
    grpo = rows.filter(pl.col("estimator") == "grpo")
    want = want_oracle * (1 - want_oracle) / g
    half = (grpo["ci_high"] - grpo["ci_low"]).to_numpy() / 2
    assert np.all(np.abs(grpo["mse"].to_numpy() - want) <= 2.5 * half + 1e-15), (grpo, want)
    assert grpo["mse"][2] > 0.03  # w = 1/2: the mixture really mixes (w (1 - w) / G = 0.0625)


def test_blend_without_a_next_checkpoint_or_epochs_is_refused():
    df = _rollouts()
    for checkpoints, epochs in ((["a"], 3), (["a", "b"], 1)):
        plan = ReplayPlan(repeats=2, ref_n=8)
        settings = EpochSchedule(batch_size=5, epochs_per_checkpoint=epochs, oracle_n=4, blend=True)
        with pytest.raises(InputError, match="blending"):
            replay_trajectory(df, "reference", checkpoints, ["grpo"], plan, settings)


@pytest.mark.parametrize(
    ("names", "blend"),
    [(["basis", "grpo", "basis_memory", "spo_tracker"], True), (["basis"], False)],
)
@pytest.mark.parametrize("knob", ["BLOCK_DRAWS", "STREAM_BYTES", "STATELESS_VISITS"])
def test_epochs_in_blocks_and_repeats_in_passes_are_the_replay_at_once(
    monkeypatch, names, blend, knob
):
    """Bounded memory: with one batch per block of draws (BLOCK_DRAWS), or one repeat per
    pass (STREAM_BYTES), the draws, states and errors are those of one block and one pass
    (sums over repeats and steps up to rounding order); a stateless estimator called once
    a step (STATELESS_VISITS) gives what it gives called on a whole block of steps."""
    plan = ReplayPlan(repeats=4, group_size=2, ref_n=8, seed=3)
    epochs = EpochSchedule(batch_size=3, epochs_per_checkpoint=2, oracle_n=4, blend=blend)
    df = _rollouts()
    whole, whole_curves = replay_trajectory(df, "reference", ["a", "b"], names, plan, epochs)
    monkeypatch.setattr(replay_plan if knob == "STREAM_BYTES" else trajectory, knob, 1)
    parts, part_curves = replay_trajectory(df, "reference", ["a", "b"], names, plan, epochs)
    assert_frame_equal(parts, whole, rel_tol=1e-12)
    for name in names:
        np.testing.assert_allclose(part_curves[name], whole_curves[name], rtol=1e-12)


def test_estimators_in_sets_of_their_own_passes_are_the_replay_of_all_in_one(monkeypatch):
    """A big state (basis_track's) runs its streams in many passes and the small ones
    (stateless, the SPO tracker's) in few, each set drawing the same epochs: the table, the
    visits' noise counted once (mse_noise_corrected, the 0/1 share, the next checkpoint's
    share) and the curves are those of every estimator in one pass, up to rounding order."""
    names = ["grpo", "basis", "spo_tracker", "basis_memory", "basis_track"]
    plan = ReplayPlan(repeats=8, group_size=2, ref_n=8, seed=3)
    epochs = EpochSchedule(batch_size=3, epochs_per_checkpoint=2, oracle_n=4, blend=True)
    df = _rollouts()
    whole, whole_curves = replay_trajectory(df, "reference", ["a", "b"], names, plan, epochs)
    # a stream at 20 prompts: 320 bytes shuffled, basis_memory 39 KiB (its losses), basis_track
    # 167 KiB, the others < 1 KiB: 8 streams a pass without basis_track, 1 with it
    monkeypatch.setattr(replay_plan, "STREAM_BYTES", 330_000)
    kernels = [get(n).kernel(get(n), get(n).parse_options(None), *_cache_table(df), (0, 1))
               for n in names]  # fmt: skip
    sets = replay_plan.stream_sets(plan.repeats, 20, kernels)
    assert [[names[i] for i in m] for m, _ in sets] == [names[:4], ["basis_track"]]
    assert [g for _, g in sets] == [8, 1]
    parts, part_curves = replay_trajectory(df, "reference", ["a", "b"], names, plan, epochs)
    assert_frame_equal(parts, whole, rel_tol=1e-12)
    for name in names:
        np.testing.assert_allclose(part_curves[name], whole_curves[name], rtol=1e-12)
    monkeypatch.setattr(replay_plan, "SPLIT_PASSES", 8)  # 8 passes of one: not past 8 x 1
    assert len(replay_plan.stream_sets(plan.repeats, 20, kernels)) == 1


def _cache_table(df):
    ids, _ = shared_prompts(df, "reference", ["a", "b"])
    cache = reward_matrix(df, "reference", ids)[:, :8]
    return TiltTable.from_cache(cache, None, PLAN.prior, list(ids)), cache


def test_only_previous_calibration_makes_basis_carry_state():
    """The trajectory gives a block of steps to one call of an estimator that carries
    nothing between steps: BASIS does only with ``previous`` calibration."""
    ref = np.random.default_rng(0).integers(0, 2, (6, 8)).astype(float)
    ids = [f"q{i}" for i in range(6)]

    def basis(calibration):
        return make_step_estimator(
            "basis", {"calibration": calibration}, prompt_ids=ids, ref_rewards=ref, lead=(2,)
        )

    assert basis("previous").carries_state and not basis("current").carries_state
    spo = make_step_estimator("spo_tracker", prompt_ids=ids, ref_rewards=ref, lead=(2,))
    assert spo.carries_state


def test_the_replay_allocates_without_numpys_huge_page_advice_and_restores_it():
    """replay_plan.small_pages: numpy's huge-page advice off inside (the replay's arrays are
    touched without waiting for the kernel to compact memory), as it was after, an error
    raised inside included."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    advise = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if advise is None:
        pytest.skip("this numpy has no huge-page advice to turn off")
    before = advise(True)
    seen: list[bool] = []
    try:
        with replay_plan.small_pages():
            seen.append(advise(False))  # the flag as small_pages left it: off
        seen.append(advise(True))  # on again after
        with pytest.raises(RuntimeError), replay_plan.small_pages():
            raise RuntimeError
        seen.append(advise(True))
    finally:
        advise(before)
    assert seen == [False, True, True]
