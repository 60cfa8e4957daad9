"""The streaming loader of bench/dataset.py gives the store's reward matrices exactly."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from basis_bench.errors import InputError
from basis_bench.evaluation import dataset
from basis_bench.evaluation.dataset import PolicyRewards, load_rewards, rewards_from_frame
from basis_bench.rollouts.store import load_rollouts, write_parquet_atomic


def _rows(policy: str, p: int, s: int, rng: np.random.Generator, values=(0.0, 1.0)):
    keep = rng.random((p, s)) < 0.9  # gaps in sample_idx
    keep[:, 0] = True
    i, k = np.nonzero(keep)
    return pl.DataFrame(
        {
            "prompt_id": [f"q{j:03d}" for j in i],
            "policy": policy,
            "sample_idx": (3 * k).astype(np.int32),
            "reward": rng.choice(np.asarray(values), i.size),
        }
    )


def _dataset(tmp_path, values=(0.0, 1.0)):
    """Two files that each mix policies, rows shuffled, sample_idx with gaps."""
    rng = np.random.default_rng(0)
    df = pl.concat([_rows("reference", 30, 9, rng, values), _rows("late", 25, 14, rng, values)])
    df = df.sample(fraction=1.0, shuffle=True, seed=1)
    write_parquet_atomic(df.head(400), tmp_path / "a.parquet")
    write_parquet_atomic(df.slice(400), tmp_path / "b.parquet")
    return tmp_path


@pytest.mark.parametrize("values", [(0.0, 1.0), (0.0, 0.25, 1e5), (-1.5e-9, 0.3, 1e300)])
def test_streamed_matrices_equal_the_stores_in_small_batches(tmp_path, monkeypatch, values):
    root = _dataset(tmp_path, values)
    monkeypatch.setattr(dataset, "BATCH_ROWS", 37)
    got = load_rewards(root, ["reference", "late"])
    want = rewards_from_frame(load_rollouts(root, optional=()))
    for policy in ("reference", "late"):
        np.testing.assert_array_equal(got[policy].prompt_ids, want[policy].prompt_ids)
        ids = got[policy].prompt_ids
        np.testing.assert_array_equal(got[policy].rows(ids), want[policy].rows(ids))
    narrow = {(0.0, 1.0): np.float16, (0.0, 0.25, 1e5): np.float32}.get(values, np.float64)
    assert got["late"].matrix.dtype == narrow


def test_rows_of_an_unknown_prompt_are_missing():
    pr = PolicyRewards.build(np.array(["a", "b"], dtype=object), np.array([[1.0, 0.0], [0.0, 1.0]]))
    out = pr.rows(np.array(["b", "zz"], dtype=object))
    np.testing.assert_array_equal(out[0], [0.0, 1.0])
    assert np.isnan(out[1]).all() and out.dtype == np.float64


def test_rows_the_stream_refuses_get_the_stores_error(tmp_path):
    df = pl.DataFrame(
        {"prompt_id": ["a", "a"], "policy": "late", "sample_idx": [0, 0], "reward": [1.0, 0.0]}
    ).with_columns(pl.col("sample_idx").cast(pl.Int32))
    write_parquet_atomic(df, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match=r"share a \(prompt_id, policy, sample_idx\) key"):
        load_rewards(tmp_path, ["late"])
    bad = df.with_columns(
        pl.Series("sample_idx", [0, 1], pl.Int32), pl.Series("reward", [1.0, np.inf])
    )
    write_parquet_atomic(bad, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match="non-finite reward"):
        load_rewards(tmp_path, ["late"])


def test_sparse_sample_idx_reads_whole_with_the_same_columns(tmp_path):
    df = pl.DataFrame(
        {
            "prompt_id": ["a", "a", "b"],
            "policy": "late",
            "sample_idx": [0, 10**7, 5],
            "reward": [1.0, 0.0, 1.0],
        }
    ).with_columns(pl.col("sample_idx").cast(pl.Int32))
    write_parquet_atomic(df, tmp_path / "sparse.parquet")
    got = load_rewards(tmp_path, ["late"])["late"]
    np.testing.assert_array_equal(
        got.rows(np.array(["a", "b"], dtype=object)), [[1.0, 0.0], [1.0, np.nan]]
    )


def test_checkpoint_arrays_hold_their_own_memory(tmp_path):
    """Pool and cache are copies: a view would keep the checkpoint's whole float64 (P, S)
    matrix alive (about 8 bytes a rollout, the largest array of a run)."""
    root = _dataset(tmp_path)
    ds = dataset.Dataset(root, load_rewards(root, ["reference", "late"]), "reference",
                         ["reference", "late"], [])  # fmt: skip
    data = dataset.checkpoint_data(ds, "late", 2, 3, 1)
    for array in (data.pool, data.cache):
        assert array.base is None and array.flags.c_contiguous
