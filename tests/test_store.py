"""The rollout store: schema checks, metadata, file-order independence, reward matrices."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import rollouts_frame

from basis_bench.errors import InputError
from basis_bench.guards.outputs import ROW_GROUP_ROWS, read_metadata, write_parquet_atomic
from basis_bench.rollouts.store import (
    conform_prompts,
    conform_rollouts,
    dataset_metadata,
    load_prompts,
    load_rollouts,
    may_repeat,
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


def test_categorical_ids_are_kept_in_memory_and_written_as_text(tmp_path):
    df = rollouts_frame("late", {"b": [1.0, 0.0], "a": [1.0]})
    codes = df.with_columns(pl.col("prompt_id", "policy").cast(pl.Categorical))
    held = conform_rollouts(codes, categorical=True)
    assert held.schema["prompt_id"] == pl.Categorical == held.schema["policy"]
    assert conform_rollouts(codes).schema["prompt_id"] == pl.String  # the default casts
    write_parquet_atomic(df, tmp_path / "text.parquet")
    write_parquet_atomic(held, tmp_path / "codes.parquet")
    text, written = (pq.read_table(tmp_path / f) for f in ("text.parquet", "codes.parquet"))
    assert written.schema.equals(text.schema) and written.equals(text)


def test_parts_are_written_a_row_group_at_a_time_as_write_table_would(tmp_path):
    rows = ROW_GROUP_ROWS + 5
    df = pl.DataFrame({"x": np.arange(rows), "s": pl.Series(np.arange(rows) % 3).cast(pl.String)})
    write_parquet_atomic(df, tmp_path / "ours.parquet")
    pq.write_table(df.to_arrow(), tmp_path / "theirs.parquet", compression="zstd")
    ours, theirs = (
        pq.ParquetFile(tmp_path / f).metadata for f in ("ours.parquet", "theirs.parquet")
    )
    groups = [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in (ours, theirs)]
    assert groups[0] == groups[1] == [ROW_GROUP_ROWS, 5]
    assert pl.read_parquet(tmp_path / "ours.parquet").equals(df)


@pytest.mark.parametrize("seed", range(5))
def test_may_repeat_never_misses_a_repeated_key(seed):
    rng = np.random.default_rng(seed)
    df = pl.DataFrame(
        {
            "prompt_id": [["a", "b", "c", None][i] for i in rng.integers(0, 4, 40)],
            "policy": pl.Series(rng.choice(["x", "y"], 40)).cast(pl.Categorical),
            "sample_idx": pl.Series(rng.integers(-2, 6, 40), dtype=pl.Int32),
        }
    )
    for key in (["prompt_id", "sample_idx"], ["policy", "sample_idx"], list(df.columns)):
        repeated = bool(df.select(pl.struct(key).is_duplicated().any()).item())
        unique = df.unique(key, keep="first", maintain_order=True)
        assert may_repeat(df, key) == repeated  # no collision among these few keys
        assert not may_repeat(unique, key)
