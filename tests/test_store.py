"""The rollout store: schema checks, metadata, file-order independence, reward matrices."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from conftest import rollouts_frame

from basis_bench.errors import InputError
from basis_bench.outputs import read_metadata, write_parquet_atomic
from basis_bench.rollouts.store import (
    conform_prompts,
    dataset_metadata,
    load_prompts,
    load_rollouts,
    reward_matrix,
    rollout_files,
)


def test_round_trip_keeps_rows_and_metadata(tmp_path):
    df = rollouts_frame("reference", {"a": [1.0, 0.0], "b": [1.0]})
    meta = {"model": "m", "simulated": False, "seed": 3}
    write_parquet_atomic(df, tmp_path / "r.parquet", metadata=meta)
    assert read_metadata(tmp_path / "r.parquet") == meta
    assert dataset_metadata(tmp_path) == [meta]
    back = load_rollouts(tmp_path)
    assert back.select(df.columns).equals(df.sort(["policy", "prompt_id", "sample_idx"]))
    assert not list(tmp_path.glob("*.tmp"))


def test_load_does_not_depend_on_file_names_or_split(tmp_path):
    df = pl.concat(
        [
            rollouts_frame("reference", {"a": [1, 0, 1], "b": [0, 0]}),
            rollouts_frame("late", {"a": [1, 1], "c": [0]}),
        ]
    )
    whole, split = tmp_path / "whole", tmp_path / "split"
    write_parquet_atomic(df, whole / "all.parquet")
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=1)
    write_parquet_atomic(shuffled[:3], split / "z.parquet")
    write_parquet_atomic(shuffled[3:], split / "a" / "b.parquet")
    assert load_rollouts(whole).equals(load_rollouts(split))


def test_prompts_file_is_not_a_rollouts_file(tmp_path):
    write_parquet_atomic(rollouts_frame("p", {"a": [1.0]}), tmp_path / "r.parquet")
    prompts = pl.DataFrame({"prompt_id": ["a"], "problem": ["1+1"], "answer": ["2"], "level": [3]})
    write_parquet_atomic(prompts, tmp_path / "prompts.parquet")
    assert [p.name for p in rollout_files(tmp_path)] == ["r.parquet"]
    assert load_prompts(tmp_path)["level"].dtype == pl.Int32
    assert load_prompts(tmp_path / "nowhere") is None


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (rollouts_frame("p", {"a": [1.0]}).drop("reward"), "missing column"),
        (rollouts_frame("p", {"a": [1.0, float("nan")]}), "non-finite reward"),
        (
            pl.concat([rollouts_frame("p", {"a": [1.0]}), rollouts_frame("p", {"a": [0.0]})]),
            "share a",
        ),
    ],
)
def test_bad_rollouts_are_input_errors(tmp_path, frame, message):
    write_parquet_atomic(frame, tmp_path / "r.parquet")
    with pytest.raises(InputError, match=message):
        load_rollouts(tmp_path)


def test_missing_directory_and_duplicate_prompts_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_rollouts(tmp_path / "missing")
    with pytest.raises(InputError, match="duplicate prompt_id"):
        conform_prompts(
            pl.DataFrame({"prompt_id": ["a", "a"], "problem": ["x", "y"], "answer": ["1", "2"]})
        )


def test_reward_matrix_orders_by_sample_idx_and_pads_with_nan():
    df = pl.DataFrame(
        {
            "prompt_id": ["b", "a", "a", "a"],
            "policy": ["p"] * 4,
            "sample_idx": [0, 7, 2, 5],
            "reward": [0.5, 0.7, 0.2, 0.5],
        },
        schema_overrides={"sample_idx": pl.Int32},
    )
    m = reward_matrix(df, "p", ["a", "b", "missing"])
    np.testing.assert_array_equal(m[0], [0.2, 0.5, 0.7])
    np.testing.assert_array_equal(m[1], [0.5, np.nan, np.nan])
    assert np.isnan(m[2]).all()
