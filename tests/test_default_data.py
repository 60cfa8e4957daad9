"""The shipped default dataset is the real SmolLM2 set its CARD.md describes, and the
simulated set in data/simulated is what it says it is."""

import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from basis_bench.evaluation.dataset import open_dataset
from basis_bench.rollouts.store import dataset_metadata, default_dataset, load_rollouts

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = {"reference": 64, "early": 272, "middle": 272, "late": 272}


@pytest.fixture(scope="module")
def rollouts() -> pl.DataFrame:
    return load_rollouts(default_dataset())


def test_default_is_real_and_in_training_order():
    ds = open_dataset()
    assert not ds.simulated
    assert ds.policies == ["reference", "early", "middle", "late"]
    meta = dataset_metadata(default_dataset())
    assert {m["kind"] for m in meta} == {"oracle"}
    assert {m["run"]["sampling"]["temperature"] for m in meta} == {1.0}


def test_every_prompt_has_every_sample_once(rollouts):
    prompts = pl.read_parquet(default_dataset() / "prompts.parquet")["prompt_id"]
    assert prompts.n_unique() == len(prompts) >= 96
    for policy, n in SAMPLES.items():
        sub = rollouts.filter(pl.col("policy") == policy)
        per = sub.group_by("prompt_id").agg(pl.col("sample_idx").sort())
        assert set(per["prompt_id"]) == set(prompts), policy
        assert all(list(s) == list(range(n)) for s in per["sample_idx"]), policy


def test_rewards_are_binary_and_responses_kept(rollouts):
    assert set(rollouts["reward"].unique()) <= {0.0, 1.0}
    assert rollouts["response"].null_count() == 0
    # A correct answer contains the reference answer as a number.
    prompts = pl.read_parquet(default_dataset() / "prompts.parquet").select("prompt_id", "answer")
    hit = rollouts.filter(pl.col("reward") == 1).join(prompts, on="prompt_id")
    assert all(a in r for a, r in zip(hit["answer"], hit["response"], strict=True))


def test_checkpoints_drift_from_the_reference(rollouts):
    """The issue's criterion: the late checkpoint's mean differs from the reference's by
    at least 0.15; drift grows early -> late (per-prompt correlation falls)."""
    v = (
        rollouts.group_by("policy", "prompt_id")
        .agg(pl.col("reward").mean())
        .pivot(on="policy", index="prompt_id", values="reward")
    )
    means = {p: v[p].mean() for p in SAMPLES}
    assert abs(means["late"] - means["reference"]) >= 0.15
    corr = [np.corrcoef(v["reference"], v[p])[0, 1] for p in ("early", "middle", "late")]
    assert corr[0] > corr[2]


def test_prompts_carry_the_reference_models_hidden_states():
    prompts = pl.read_parquet(default_dataset() / "prompts.parquet")
    assert prompts.schema["features"] == pl.List(pl.Float32)
    hidden = np.asarray(prompts["features"].to_list())
    assert hidden.shape == (96, 576) and np.isfinite(hidden).all()
    assert np.linalg.matrix_rank(hidden) == 96  # a distinct state per prompt


@pytest.mark.slow
def test_stored_hidden_states_are_smollm2s_own(one_torch_thread):
    """Recomputed for three prompts, with the template the reference run recorded."""
    from basis_bench.rollouts.models import resolve_checkpoint
    from basis_bench.rollouts.sampling.hf import HFSampler

    sys.path.insert(0, str(ROOT / "experiments" / "default_data"))
    from features import reference_job  # the script that stored them

    job, _ = reference_job(default_dataset())
    sampler = HFSampler.load(resolve_checkpoint(job.generation.model), "cpu", job.template)
    prompts = pl.read_parquet(default_dataset() / "prompts.parquet").head(3)
    direct = sampler.prompt_hidden_states(prompts["problem"].to_list())
    np.testing.assert_allclose(np.asarray(prompts["features"].to_list()), direct, atol=1e-4)


def test_simulated_set_is_labelled_simulated():
    ds = open_dataset(ROOT / "data" / "simulated")
    assert ds.simulated and ds.policies == ["reference", "early", "middle", "late"]
