"""The replay engine and `basis-bench evaluate` on small simulated datasets."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import polars as pl
import pytest
from conftest import assert_one_line_error, run_main

from basis_bench.errors import InputError
from basis_bench.estimators import ESTIMATORS, available
from basis_bench.evaluation import replay as replay_module
from basis_bench.evaluation.config import EvaluateConfig, SensitivityConfig
from basis_bench.evaluation.dataset import open_dataset
from basis_bench.evaluation.oracle_noise import noise_warning, rivalled
from basis_bench.evaluation.record import RunRecord
from basis_bench.evaluation.replay import Moments, Replay, Series, draw_batches, draw_rollouts
from basis_bench.evaluation.run import evaluate
from basis_bench.evaluation.tables import bin_index, difficulty_table, heterogeneity_table
from basis_bench.guards.outputs import write_parquet_atomic
from basis_bench.rollouts.simulate import SimulationConfig, simulate
from basis_bench.rollouts.store import load_rollouts

ORACLE_N = 64
FAST = {"repeats": 200, "oracle_n": ORACLE_N}


@pytest.fixture(scope="module")
def tilt_data(tmp_path_factory):
    """BASIS's model holds: checkpoints are logit shifts of the reference (small noise)."""
    root = tmp_path_factory.mktemp("tilt")
    return simulate(
        SimulationConfig(n_prompts=300, ref_n=64, checkpoint_n=ORACLE_N + 16, seed=3), root
    )


@pytest.fixture(scope="module")
def tilt_result(tilt_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("tilt-out")
    return evaluate(EvaluateConfig(rollouts=str(tilt_data), **FAST), out)


def write_rewards(root, rewards: dict[str, np.ndarray], metadata=None, prefix="sim-"):
    """A rollouts dataset from {policy: (P, S) rewards}, one file per policy."""
    for policy, m in rewards.items():
        p, s = m.shape
        df = pl.DataFrame(
            {
                "prompt_id": np.repeat([f"{prefix}{i:03d}" for i in range(p)], s),
                "policy": policy,
                "sample_idx": np.tile(np.arange(s, dtype=np.int32), p),
                "reward": m.ravel().astype(float),
            }
        )
        write_parquet_atomic(df, root / f"{policy}.parquet", metadata=metadata)
    return root


def test_basis_beats_grpo8_and_halves_reinforce_pp_where_its_model_holds(tilt_result):
    s = tilt_result.summary
    for name in ("early", "middle", "late"):
        mse = {
            r["estimator"]: r["mse"]
            for r in s.filter(pl.col("checkpoint") == name).iter_rows(named=True)
        }
        assert mse["basis"] < mse["grpo"], name
        assert mse["basis"] < 0.5 * mse["reinforce_pp"], name


def test_rloo_is_worse_than_grpo_at_every_group_size(tilt_result):
    sweep = pl.read_csv(tilt_result.out / "g_sweep.csv")
    assert set(sweep["group_size"]) == {2, 4, 8, 16}
    wide = sweep.pivot(on="estimator", index=["checkpoint", "group_size"], values="mse")
    assert (wide["rloo"] > wide["grpo"]).all()
    summary = tilt_result.summary.filter(pl.col("estimator").is_in(["grpo", "rloo"]))
    assert set(summary["rollouts_per_prompt"]) == {8}


def test_output_files_and_estimate_rows(tilt_result):
    out = tilt_result.out
    for name in (
        "summary",
        "g_sweep",
        "by_heterogeneity",
        "by_difficulty",
        "beta_choice",
        "fixed_beta",
    ):
        assert (out / f"{name}.csv").stat().st_size > 0
    est = pl.read_parquet(out / "estimates.parquet")
    assert est.columns == [
        "checkpoint", "repeat", "prompt_id", "estimator", "rollouts_per_prompt", "estimate", "oracle", "sq_err",
    ]  # fmt: skip
    assert est.height == 3 * FAST["repeats"] * 64 * sum(not e.stateful for e in ESTIMATORS.values())
    single = est.filter(pl.col("rollouts_per_prompt") == 1)
    np.testing.assert_allclose(single["sq_err"], (single["estimate"] - single["oracle"]) ** 2)
    # summary.csv is the mean of the rows; the noise correction subtracts v(1-v)/(oracle_n - 1)
    s = tilt_result.summary
    means = est.group_by("checkpoint", "estimator").agg(pl.col("sq_err").mean(), pl.len())
    joined = s.join(means, on=["checkpoint", "estimator"])
    np.testing.assert_allclose(joined["mse"], joined["sq_err"], rtol=1e-9)
    assert (joined["n_estimates"] == joined["len"]).all()
    basis = est.filter((pl.col("estimator") == "basis") & (pl.col("checkpoint") == "late"))
    noise = (basis["oracle"] * (1 - basis["oracle"]) / (ORACLE_N - 1)).mean()
    row = s.filter((pl.col("estimator") == "basis") & (pl.col("checkpoint") == "late")).row(
        0, named=True
    )
    assert row["mse_noise_corrected"] == pytest.approx(row["mse"] - noise, rel=1e-9)
    assert row["ci_low"] < row["mse"] < row["ci_high"]
    assert row["extreme_rate"] == 0.0
    vanilla = s.filter(pl.col("estimator") == "vanilla")
    assert (vanilla["extreme_rate"] == 1.0).all()


def test_beta_choices_and_fixed_beta_curve(tilt_result):
    betas = pl.read_csv(tilt_result.out / "beta_choice.csv")
    assert (
        betas.group_by("checkpoint").agg(pl.col("count").sum())["count"].to_list()
        == [FAST["repeats"]] * 3
    )
    fixed = pl.read_csv(tilt_result.out / "fixed_beta.csv")
    late = fixed.filter(pl.col("checkpoint") == "late")
    best = late.sort("initial_mse")["beta"][0]
    assert 0.3 < best < 1.5  # the simulated late tilt is 1/beta = 1.5, beta ~ 0.67


def test_same_seed_same_files_other_seed_other_numbers(tilt_data, tmp_path, monkeypatch):
    import basis_bench.evaluation.run as run_module

    # The provenance's date has one-second resolution; two runs may straddle a second.
    fixed = run_module.provenance()
    monkeypatch.setattr(run_module, "provenance", lambda: fixed)
    cfg = EvaluateConfig(
        rollouts=str(tilt_data), repeats=30, oracle_n=ORACLE_N, checkpoints=("late",)
    )
    a, b = evaluate(cfg, tmp_path / "a"), evaluate(cfg, tmp_path / "b")
    for f in sorted(a.out.iterdir()):
        if f.name == "run.json":  # its provenance holds the date and argv
            ra, rb = (json.loads(p.read_text()) for p in (f, b.out / f.name))
            same = {"provenance": None, "run_id": None}  # the date, argv and a fresh run id
            assert {**ra, **same} == {**rb, **same}
            assert ra["provenance"]["git_commit"] == rb["provenance"]["git_commit"]
            continue
        assert f.read_bytes() == (b.out / f.name).read_bytes(), f.name
    c = evaluate(EvaluateConfig(**{**cfg.__dict__, "seed": 1}), tmp_path / "c")
    assert not c.summary["mse"].equals(a.summary["mse"])


def test_file_order_does_not_matter(tilt_data, tmp_path):
    df = load_rollouts(tilt_data).filter(pl.col("policy").is_in(["reference", "late"]))
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=7)
    half = shuffled.height // 2
    meta = {"reference_policy": "reference"}
    write_parquet_atomic(shuffled[half:], tmp_path / "other" / "b" / "0.parquet", metadata=meta)
    write_parquet_atomic(shuffled[:half], tmp_path / "other" / "a.parquet", metadata=meta)
    cfg = dict(repeats=30, oracle_n=ORACLE_N, checkpoints=("late",))
    a = evaluate(EvaluateConfig(rollouts=str(tilt_data), **cfg), tmp_path / "out-a")
    b = evaluate(EvaluateConfig(rollouts=str(tmp_path / "other"), **cfg), tmp_path / "out-b")
    for name in (
        "summary.csv",
        "by_heterogeneity.csv",
        "by_difficulty.csv",
        "g_sweep.csv",
        "fixed_beta.csv",
    ):
        assert (a.out / name).read_bytes() == (b.out / name).read_bytes(), name
    assert pl.read_parquet(a.out / "estimates.parquet").equals(
        pl.read_parquet(b.out / "estimates.parquet")
    )


def test_heterogeneity_bins_follow_the_protocol():
    spread = np.array([0.20, 0.21, 0.22, 0.25, 0.30, 0.24, 0.205])
    mse = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    rep = Replay(
        checkpoint="c",
        series={("x", 1): Series.of("x", 1, mse, np.zeros(7))},
        sweep={},
        noise=Moments(7, 0.5),
        spread=Moments(7, 0.2),
        batch_noise=np.full(7, 0.5),
        batch_spread=spread,
        difficulty=pl.DataFrame(),
        beta_counts=np.zeros(1, dtype=np.int64),
        fixed_beta=np.zeros((2, 1)),
        fixed_beta_n=1,
        betas=np.array([np.inf]),
    )
    t = heterogeneity_table(rep, n_batches=6)  # the 7th batch is beyond the protocol's count
    np.testing.assert_allclose(t["bin_low"], [0.20, 0.22, 0.24, 0.26, 0.28])
    np.testing.assert_allclose(t["bin_high"], [0.22, 0.24, 0.26, 0.28, 0.30])
    # [.20,.22): 0.20, 0.21 | [.22,.24): 0.22 | [.24,.26): 0.25, 0.24 | [.26,.28): - | [.28,.30]: 0.30 (max, closed)
    assert t["n_batches"].to_list() == [2, 1, 2, 0, 1]
    np.testing.assert_allclose(t["mse"].to_numpy(), [1.5, 3.0, 5.0, np.nan, 5.0])
    np.testing.assert_allclose(t["mse_noise_corrected"].to_numpy(), [1.0, 2.5, 4.5, np.nan, 4.5])


def test_difficulty_bins_follow_the_protocol():
    oracle = np.array([0.0, 0.19, 0.2, 0.5, 0.79, 0.8, 1.0, 0.4])
    sq = np.arange(8.0)
    rep = Replay(
        checkpoint="c",
        series={},
        sweep={},
        noise=Moments(1, 0.0),
        spread=Moments(1, 0.0),
        batch_noise=np.zeros(1),
        batch_spread=np.zeros(1),
        difficulty=pl.DataFrame(
            {
                "estimator": "x",
                "rollouts_per_prompt": 1,
                "oracle": oracle,
                "sq_err": sq,
                "noise": 0.0,
            }
        ),
        beta_counts=np.zeros(1, dtype=np.int64),
        fixed_beta=np.zeros((2, 1)),
        fixed_beta_n=1,
        betas=np.array([np.inf]),
    )
    t = difficulty_table(rep)
    assert t["bin_low"].to_list() == [0.0, 0.2, 0.4, 0.6, 0.8]
    assert t["bin_high"].to_list() == [0.2, 0.4, 0.6, 0.8, 1.0]
    # [0,.2): 0, .19 | [.2,.4): .2 | [.4,.6): .5, .4 | [.6,.8): .79 | [.8,1]: .8, 1.0
    assert t["n_estimates"].to_list() == [2, 1, 2, 1, 2]
    np.testing.assert_allclose(t["mse"], [0.5, 2.0, 5.0, 4.0, 5.5])
    np.testing.assert_array_equal(
        bin_index(np.array([0.6, 0.8 - 1e-12]), np.array([0, 0.2, 0.4, 0.6, 0.8, 1])), [3, 3]
    )


def test_difficulty_uses_the_first_ten_repeats(tilt_result):
    d = pl.read_csv(tilt_result.out / "by_difficulty.csv")
    counts = d.group_by("checkpoint", "estimator").agg(pl.col("n_estimates").sum())["n_estimates"]
    assert (counts == 10 * 64).all()
    h = pl.read_csv(tilt_result.out / "by_heterogeneity.csv")
    assert (
        h.group_by("checkpoint", "estimator").agg(pl.col("n_batches").sum())["n_batches"]
        == FAST["repeats"]
    ).all()


def test_draws_are_without_replacement_and_cover_the_pool():
    rng = np.random.default_rng(0)
    batches = draw_batches(rng, 10, 4, 500)
    assert all(len(set(row)) == 4 for row in batches)
    assert np.bincount(batches.ravel(), minlength=10).min() > 150  # ~200 each
    counts = np.array([[3, 5]])
    cols = draw_rollouts(rng, np.repeat(counts, 400, axis=0), 3, 5)
    assert (cols[:, 0] < 3).all() and np.all(np.sort(cols[:, 0], axis=-1) == [0, 1, 2])
    assert all(len(set(c)) == 3 for c in cols[:, 1])
    first = np.bincount(cols[:, 1, 0], minlength=5)
    assert first.min() > 50  # every pool column can come first


def test_batches_drawn_in_blocks_of_keys_are_the_one_call_draw(monkeypatch):
    """Sort keys come BATCH_KEYS at a time (bounded memory at any prompt count): the batches
    are those of one (repeats, P) draw, and the generator ends in the same state."""
    whole, blocks = np.random.default_rng(3), np.random.default_rng(3)
    keys = whole.random((37, 50))
    expected = np.argpartition(keys, 7, axis=1)[:, :8]
    monkeypatch.setattr(replay_module, "BATCH_KEYS", 120)  # two rows of 50 keys at a time
    assert np.array_equal(draw_batches(blocks, 50, 8, 37), expected)
    assert whole.random() == blocks.random()


def test_continuous_rewards_evaluate(tmp_path):
    rng = np.random.default_rng(0)
    v = rng.beta(2, 2, size=80)
    data = {
        "reference": rng.beta(4 * v[:, None] + 0.1, 4 * (1 - v[:, None]) + 0.1, size=(80, 16)),
        "late": rng.beta(4 * v[:, None] + 1, 4 * (1 - v[:, None]) + 0.1, size=(80, 40)),
    }
    write_rewards(tmp_path / "d", data)
    res = evaluate(
        EvaluateConfig(
            rollouts=str(tmp_path / "d"), repeats=20, oracle_n=24, ref_n=16, batch_size=16
        ),
        tmp_path / "o",
    )
    assert res.summary["mse"].is_finite().all()
    assert res.summary.filter(pl.col("estimator") == "basis")["extreme_rate"][0] == 0.0


def test_reference_from_metadata_and_default_checkpoints(tmp_path):
    rng = np.random.default_rng(0)
    data = {
        name: (rng.random((20, 12)) < 0.5).astype(float) for name in ("base", "step100", "step200")
    }
    write_rewards(
        tmp_path / "d",
        data,
        metadata={"reference_policy": "base", "policies": ["base", "step200", "step100"]},
    )
    ds = open_dataset(tmp_path / "d")
    assert ds.reference == "base"
    assert ds.checkpoints == ["step200", "step100"]
    res = evaluate(
        EvaluateConfig(
            rollouts=str(tmp_path / "d"), repeats=5, oracle_n=4, ref_n=8, batch_size=8, group_size=4
        ),
        tmp_path / "o",
    )
    assert res.summary["checkpoint"].unique(maintain_order=True).to_list() == ["step200", "step100"]
    with pytest.raises(InputError, match="reference policy 'nope' not in the dataset"):
        open_dataset(tmp_path / "d", reference="nope")
    write_rewards(tmp_path / "e", data)
    with pytest.raises(InputError, match="cannot tell which policy is the reference"):
        open_dataset(tmp_path / "e")
    assert open_dataset(tmp_path / "e", reference="step100").checkpoints == ["base", "step200"]


def test_prompts_missing_from_reference_are_dropped_and_counted(tmp_path):
    rng = np.random.default_rng(0)
    write_rewards(tmp_path / "d", {"reference": (rng.random((20, 8)) < 0.5).astype(float)})
    write_rewards(tmp_path / "d", {"late": (rng.random((24, 12)) < 0.5).astype(float)})
    res = evaluate(
        EvaluateConfig(
            rollouts=str(tmp_path / "d"), repeats=5, oracle_n=4, ref_n=8, batch_size=8, group_size=4
        ),
        tmp_path / "o",
    )
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["checkpoints"]["late"] == {"prompts": 20, "dropped_no_reference": 4, "min_pool": 8}
    assert res.run == RunRecord.read(tmp_path / "o" / "run.json")
    # the declared type holds every key evaluate writes: read and written again, the same text
    assert res.run.to_json() == (tmp_path / "o" / "run.json").read_text()
    write_rewards(tmp_path / "x", {"reference": np.ones((3, 8))}, prefix="other-")
    write_rewards(tmp_path / "x", {"late": np.ones((3, 8))})
    with pytest.raises(InputError, match="none of its prompts is in the reference cache"):
        evaluate(
            EvaluateConfig(
                rollouts=str(tmp_path / "x"), oracle_n=4, ref_n=8, batch_size=2, group_size=2
            ),
            tmp_path / "o2",
        )


@pytest.fixture
def small(tmp_path):
    rng = np.random.default_rng(0)
    return write_rewards(
        tmp_path / "d",
        {
            "reference": (rng.random((20, 8)) < 0.5).astype(float),
            "late": (rng.random((20, 12)) < 0.5).astype(float),
        },
    )


@pytest.mark.parametrize(
    ("mutate", "args", "message"),
    [
        (lambda df: df.drop("sample_idx"), (), "missing column"),
        (
            lambda df: df.with_columns(
                pl.when(pl.int_range(pl.len()) == 3)
                .then(float("nan"))
                .otherwise(pl.col("reward"))
                .alias("reward")
            ),
            (),
            "non-finite reward",
        ),
        (None, ("--checkpoint", "early"), "unknown checkpoint(s) 'early'; known: late"),
        (None, ("--group-size", "9"), "pool is smaller than the group size"),
        (None, ("--estimators", "basis,nope"), "unknown estimator 'nope'"),
        (None, ("--ref-n", "9"), "more reference samples than the dataset has"),
        (None, ("--calibration", "fixed"), "calibration fixed needs fixed_beta"),
        (None, ("--features", "hidden"), "--features must be one of auto, stored"),
        (None, ("--features", "stored"), "features 'stored' need the dataset's prompts.parquet"),
        (None, ("--features", "plain"), "features 'plain' need the dataset's prompts.parquet"),
        (None, ("--features", "text"), "features 'text' need the dataset's prompts.parquet"),
        (
            None,
            ("--no-trajectory", "--trajectory-epochs", "3"),
            "--trajectory-epochs applies only to the trajectory replay",
        ),
        (
            None,
            ("--no-trajectory", "--features", "none", "--trajectory-blend"),
            "--trajectory-blend, --features apply only to the trajectory replay",
        ),
        (
            None,
            ("--no-trajectory", "--estimators", "basis,basis_memory"),
            "basis_memory: stateful, run only in the trajectory replay",
        ),
    ],
)
def test_user_errors_are_one_line_without_traceback(
    small, tmp_path, monkeypatch, capsys, mutate, args, message
):
    if mutate is not None:
        path = small / "late.parquet"
        write_parquet_atomic(mutate(pl.read_parquet(path)), path)
    result = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(small), "--oracle-n", "4", "--ref-n", "8",
        "--batch-size", "8", "--repeats", "3", "--out", str(tmp_path / "o"), *args,
    )  # fmt: skip
    assert_one_line_error(result, message)
    assert "Traceback" not in result.out


def test_cli_runs_and_prints_the_table(small, tmp_path, monkeypatch, capsys):
    code, _, out = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(small), "--oracle-n", "4", "--ref-n", "8",
        "--batch-size", "8", "--repeats", "3", "--group-size", "4", "--calibration", "fixed",
        "--fixed-beta", "inf", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 0
    assert "checkpoint late" in out and "reinforce_pp" in out and "basis_vop" in out
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    # strict JSON: the infinity written as the user gives it, not as Infinity
    assert run["config"]["basis_options"] == {"calibration": "fixed", "fixed_beta": "inf"}
    assert run["estimator_options"]["basis"]["fixed_beta"] == "inf"
    assert run["estimator_options"]["grpo"] == {}
    assert set(run["provenance"]) >= {"git_commit", "date_utc", "argv", "versions"}
    # --estimators all (the default) is recorded as the estimators it expanded to
    assert run["config"]["estimators"] == list(available())
    # with a fixed beta = inf and no refinement, offline equals the reference mean exactly
    est = pl.read_parquet(tmp_path / "o" / "estimates.parquet")
    wide = est.filter(pl.col("estimator").is_in(["offline", "reference_mean"])).pivot(
        on="estimator", index=["repeat", "prompt_id"], values="estimate"
    )
    np.testing.assert_array_equal(wide["offline"], wide["reference_mean"])


def test_default_dataset_is_real_and_runs_without_rollouts_option(tmp_path):
    res = evaluate(EvaluateConfig(repeats=5, estimators=("basis", "grpo")), tmp_path)
    assert res.run.simulated is False
    assert res.summary["checkpoint"].unique(maintain_order=True).to_list() == [
        "early",
        "middle",
        "late",
    ]
    assert res.summary.height == 2 * len(res.run.checkpoints)


def test_each_estimator_gets_only_its_own_options_object():
    from basis_bench.estimators import ApoOptions, BasisOptions, JamesSteinOptions, NoOptions, get
    from basis_bench.evaluation.run import resolve_options

    names = ("basis", "basis_vop", "grpo", "reference_mean", "james_stein", "apo")
    opts, beta = resolve_options(
        [get(n) for n in names],
        {"eps": 1e-3, "criterion": "refined"},
        {"james_stein": {"eps": 1e-4}, "apo": {"beta": 2.0}, "basis_vop": {"shrink": True}},
    )
    assert opts["basis"] == BasisOptions(eps=1e-3, criterion="refined")
    assert opts["basis_vop"] == BasisOptions(
        eps=1e-3, criterion="refined", variant="vop", shrink=True
    )
    assert opts["grpo"] == NoOptions() and opts["reference_mean"] == NoOptions()
    # james_stein has its own eps, unrelated to BASIS's active set
    assert opts["james_stein"] == JamesSteinOptions(eps=1e-4)
    assert opts["apo"] == ApoOptions(beta=2.0)
    assert beta == opts["basis"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"apo": {"eps": 1.0}}, "unknown option(s) eps for estimator 'apo'; valid: beta"),
        ({"grpo": {"x": 1}}, "for estimator 'grpo'; valid: (none"),
        ({"nope": {}}, "unknown estimator 'nope'"),
        ({"basis": {"eps": float("nan")}}, "basis.eps must be a number, not NaN"),
    ],
)
def test_bad_estimator_options_are_clear_errors(extra, message):
    from basis_bench.estimators import get
    from basis_bench.evaluation.run import resolve_options

    with pytest.raises(InputError) as err:
        resolve_options([get("basis"), get("apo"), get("grpo")], {}, extra)
    assert message in str(err.value)


def test_cli_option_reaches_one_estimator(small, tmp_path, monkeypatch, capsys):
    code, _, _ = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(small), "--oracle-n", "4", "--ref-n", "8",
        "--batch-size", "8", "--repeats", "3", "--estimators", "apo,basis", "--option", "apo.beta=2",
        "--eps", "1e-3", "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 0
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["estimator_options"] == {
        "apo": {"beta": 2.0},
        "basis": {**run["estimator_options"]["basis"], "eps": 1e-3},
    }
    result = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(small), "--option", "apo.nope=1",
        "--out", str(tmp_path / "p"),
    )  # fmt: skip
    assert result.code == 2 and "valid: beta" in result.message
    result = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(small), "--estimators", "basis,grpo",
        "--option", "apo.beta=2", "--out", str(tmp_path / "q"),
    )  # fmt: skip
    assert_one_line_error(result, "apo is not among the estimators", "--estimators")
    assert not (tmp_path / "q").exists()


def test_stateful_estimators_run_through_the_trajectory_only(tilt_data, tilt_result, tmp_path):
    """Every stateful estimator, the SPO tracker included, goes through the one trajectory
    replay: rows in trajectory.csv, none in summary.csv, with ``all`` and when named."""
    stateful = {name for name, e in ESTIMATORS.items() if e.stateful}
    assert "spo_tracker" in stateful
    assert not stateful & set(tilt_result.summary["estimator"])
    assert tilt_result.trajectory is not None
    rows = tilt_result.trajectory.filter(
        (pl.col("estimator") == "spo_tracker") & (pl.col("scope") == "checkpoint")
    )
    assert rows["checkpoint"].to_list() == tilt_result.run.trajectory["checkpoint_order"]
    assert rows["mse"].is_finite().all() and tilt_result.run.trajectory["repeats"] == 200
    named = evaluate(
        EvaluateConfig(rollouts=str(tilt_data), estimators=("spo_tracker", "basis"), **FAST),
        tmp_path / "a",
    )
    assert set(named.summary["estimator"]) == {"basis"}
    assert named.trajectory is not None
    assert named.trajectory["estimator"].unique(maintain_order=True).to_list() == [
        "spo_tracker", "basis"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("config", "values", "message"),
    [
        (EvaluateConfig, {"batch_size": 1}, "--batch-size must be >= 2; got 1"),
        (EvaluateConfig, {"oracle_n": 1}, "--oracle-n must be >= 2"),
        (EvaluateConfig, {"repeats": 0}, "--repeats must be >= 1"),
        (EvaluateConfig, {"seed": -1}, "--seed must be in [0, 9223372036854775807]"),
        (EvaluateConfig, {"trajectory_epochs": 0}, "--trajectory-epochs must be >= 1"),
        (EvaluateConfig, {"ref_n": 2.5}, "--ref-n must be an integer"),
        (SensitivityConfig, {"eps": float("nan")}, "--eps must be a number, not NaN"),
        (SensitivityConfig, {"eps": -1e-6}, "--eps must be >= 0"),
        (SensitivityConfig, {"grid_size": 0}, "--grid-size must be in [1, 1024]"),
    ],
)
def test_benchmark_settings_out_of_range_are_refused_where_made(config, values, message):
    with pytest.raises(InputError, match=re.escape(message)):
        config(**values)


def test_every_benchmark_setting_carries_its_help():
    for config in (EvaluateConfig, SensitivityConfig):
        for f in dataclasses.fields(config):
            assert f.metadata["help"].endswith("."), (config.__name__, f.name)


def test_the_commands_read_default_and_help_from_the_configs():
    """A default or a help text is written once: in the config field the option reads."""
    import typer.main

    from basis_bench.cli.app import app
    from basis_bench.rollouts.simulation import SimulationConfig
    from basis_bench.settings import setting_flag, setting_help

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name, config in (
        ("evaluate", EvaluateConfig),
        ("sensitivity", SensitivityConfig),
        ("simulate", SimulationConfig),
    ):
        defaults = config()
        params = {opt: p for p in commands[name].params for opt in p.opts}
        for f in dataclasses.fields(config):
            flag = setting_flag(config, f.name).split("/")[0]
            if flag not in params:  # set through other options (basis_options)
                continue
            param = params[flag]
            assert param.help == setting_help(config, f.name), (name, flag)
            value = getattr(defaults, f.name)
            if isinstance(value, int | float | str):
                assert param.default == value, (name, flag)
            elif isinstance(value, tuple) and value and param.default is not None:
                assert param.default == ",".join(value), (name, flag)


def test_the_defaults_left_to_the_data_fit_it_and_given_values_stay():
    """B = 64 or every prompt; the oracle 256 samples or all but a pool of 16; the cache 64
    reference samples or all; a value given is never changed (too large for the data, it is
    refused as before)."""
    from basis_bench.evaluation.config import EvaluateConfig

    def fitted(cfg, prompts, samples, reference=64):
        cfg = cfg.fit(prompts, samples, reference)
        return cfg.batch, cfg.oracle, cfg.cache_n

    assert fitted(EvaluateConfig(), 128, 272) == (64, 256, 64)  # the default data: as before
    assert fitted(EvaluateConfig(), 48, 128) == (48, 112, 64)  # the dense trajectory
    assert fitted(EvaluateConfig(), 500, 1000, 100) == (64, 256, 64)
    assert fitted(EvaluateConfig(), 256, 32, 32) == (64, 16, 32)  # the gradient set: all 32
    assert fitted(EvaluateConfig(batch_size=8, oracle_n=200, ref_n=8), 48, 128) == (8, 200, 8)
    with pytest.raises(RuntimeError, match="fit"):
        _ = EvaluateConfig().batch
    with pytest.raises(RuntimeError, match="fit"):
        _ = EvaluateConfig().cache_n


def test_grpo_advantage_noise_is_rloos_on_rloo_scale():
    """GRPO's advantage on RLOO's scale, (G / (G - 1))(r - mean_G) = r - mean_-i, has RLOO's
    baseline error in expectation: sigma^2 / (G - 1), G / (G - 1) times GRPO's own MSE."""
    from basis_bench.api import evaluate

    out = evaluate(estimators=["grpo", "rloo", "vanilla"], repeats=400, trajectory=False).summary
    for ckpt in out["checkpoint"].unique().to_list():
        rows = {
            r["estimator"]: r
            for r in out.filter(pl.col("checkpoint") == ckpt).iter_rows(named=True)
        }
        grpo, rloo = rows["grpo"], rows["rloo"]
        assert grpo["adv_noise_excess"] == pytest.approx(rloo["mse_noise_corrected"], rel=0.06)
        assert rloo["adv_noise_excess"] == rloo["mse_noise_corrected"]
        assert grpo["adv_noise_excess"] > grpo["mse_noise_corrected"] * 1.1  # the 8/7 is there
        # E[A^2] / V(1 - V): one more than the excess over the prompts' reward variance
        assert rows["vanilla"]["adv_noise_ratio"] > rloo["adv_noise_ratio"] > 1


def test_oracle_noise_rivals_the_mse_where_it_is_half_the_corrected_mse_or_more():
    """The rule: noise (raw - corrected) at least the smallest corrected MSE, or a
    corrected MSE below zero, flags the checkpoint; noise well below every MSE does not."""
    rows = {
        "checkpoint": ["a", "a", "b", "b", "c", "c"],
        "estimator": ["x", "y"] * 3,
        "mse_noise_corrected": [0.05, 0.011, 0.05, 0.0099, 0.05, -0.002],
    }
    table = pl.DataFrame(rows).with_columns((pl.col("mse_noise_corrected") + 0.01).alias("mse"))
    flagged = rivalled(table)
    assert flagged["checkpoint"].to_list() == ["b", "c"]
    assert flagged["negative"].to_list() == [[], ["y"]]
    np.testing.assert_allclose(flagged["noise"], [0.01, 0.01])
    line = noise_warning(table, 4)
    assert "checkpoint(s) b, c" in line and "oracle 4 samples" in line and "(y)" in line
    assert noise_warning(table.filter(pl.col("checkpoint") == "a"), 4) is None
    # a checkpoint whose oracle samples all agree (all 0): no noise, even under an exact MSE
    exact = {"checkpoint": ["d", "d"], "estimator": ["x", "y"], "mse": [0.0, 0.04]}
    assert noise_warning(pl.DataFrame(exact).with_columns(mse_noise_corrected="mse"), 2) is None


def test_evaluate_on_a_four_sample_oracle_warns_in_one_line_and_in_run_json(
    tilt_data, tilt_result, tmp_path, monkeypatch, capsys
):
    # a 64-sample oracle: its noise (0.002) below every corrected MSE (0.003 and more)
    assert list(tilt_result.run.warnings) == []
    code, _, out = run_main(
        monkeypatch, capsys, "evaluate", "--rollouts", str(tilt_data), "--oracle-n", "4",
        "--estimators", "basis,grpo,reinforce_pp", "--repeats", "20", "--no-trajectory",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 0
    warned = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "the oracle's noise rivals the MSE it corrects" in warned[0]
    assert "(within the oracle's noise)" in " ".join(out.split())  # the tables' titles too
    run = json.loads((tmp_path / "o" / "run.json").read_text())
    assert run["warnings"] == [warned[0].removeprefix("warning: ")]
    summary = pl.read_csv(tmp_path / "o" / "summary.csv")
    assert set(rivalled(summary)["checkpoint"]) == set(summary["checkpoint"])


def test_the_summary_prints_no_nan_where_the_noise_ratio_is_undefined():
    """A checkpoint whose every oracle value is 0 or 1 (an lm-eval import that never
    succeeds) has no reward variance to put the advantage noise over: it printed "+nan%"."""
    from rich.console import Console

    from basis_bench.cli.evaluation import print_summary

    row = {
        "checkpoint": "c", "estimator": "grpo", "rollouts_per_prompt": 2, "mse": 0.0,
        "mse_noise_corrected": 0.0, "ci_low": 0.0, "ci_high": 0.0, "extreme_rate": 1.0,
        "adv_noise_ratio": float("nan"),
    }  # fmt: skip
    console = Console(record=True, width=120)
    print_summary(
        pl.DataFrame([row, {**row, "estimator": "rloo", "adv_noise_ratio": 1.25}]), console
    )
    text = console.export_text()
    assert "nan" not in text and "n/a" in text and "+25.0%" in text
