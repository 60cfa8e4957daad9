"""Prompt features as data: `import --prompts` carries a ``features`` column into the
dataset's prompts.parquet (and refuses a malformed one), and every reader hands it on."""

from __future__ import annotations

import polars as pl
from conftest import assert_one_line_error, run_main

from basis_bench.rollouts.features import prompt_features
from basis_bench.rollouts.store import load_prompts

COUNTS = "prompt_id,n,n_correct\np1,8,3\np2,5,0\n"


def test_import_prompts_carries_a_features_column(tmp_path, monkeypatch, capsys):
    (tmp_path / "c.csv").write_text(COUNTS)
    table = pl.DataFrame(
        {
            "prompt_id": ["p1", "p2"],
            "problem": ["1+1?", "2+2?"],
            "answer": ["2", "4"],
            "features": [[0.5, -1.0, 2.0], [1.5, 0.0, -2.0]],
        }
    )
    table.write_parquet(tmp_path / "prompts.parquet")
    out = tmp_path / "ds"
    args = ["import", "counts", str(tmp_path / "c.csv"), "--policy", "ckpt", "--out", str(out)]
    run = run_main(monkeypatch, capsys, *args, "--prompts", str(tmp_path / "prompts.parquet"))
    assert run.code == 0, run.message
    stored = load_prompts(out)
    assert stored is not None
    assert prompt_features(stored, ["p2", "p1"]).tolist() == [[1.5, 0.0, -2.0], [0.5, -1.0, 2.0]]

    ragged = table.with_columns(pl.Series("features", [[1.0, 2.0], [1.0]]))
    ragged.write_parquet(tmp_path / "ragged.parquet")
    run = run_main(
        monkeypatch, capsys, *args[:-1], str(tmp_path / "bad"), "--prompts",
        str(tmp_path / "ragged.parquet"),
    )  # fmt: skip
    assert_one_line_error(run, "'features' column", "one length")
    words = table.with_columns(pl.Series("features", [["a"], ["b"]]))
    words.write_parquet(tmp_path / "words.parquet")
    run = run_main(
        monkeypatch, capsys, *args[:-1], str(tmp_path / "bad"), "--prompts",
        str(tmp_path / "words.parquet"),
    )  # fmt: skip
    assert_one_line_error(run, "'features' column must hold numbers")


def test_plugins_give_basis_context_the_stored_features_by_prompt_key(tmp_path):
    """verl/TRL build basis_context from a rollouts directory: its prompts table's features
    (e.g. oracle --store-features hidden) reach the estimator in the cache's key order."""
    from basis_bench.guards.outputs import write_parquet_atomic
    from basis_bench.integrations.keys import basis_from_rollouts, prompt_key
    from basis_bench.integrations.verl import settings

    problems = [f"What is {i} + 1?" for i in range(6)]
    features = [[float(i), float(i * i % 5)] for i in range(6)]
    pl.DataFrame(
        {
            "prompt_id": [f"p{i}" for i in range(6)],
            "problem": problems,
            "answer": [str(i + 1) for i in range(6)],
            "features": features,
        }
    ).write_parquet(tmp_path / "prompts.parquet")
    rows = [(f"p{i}", "reference", k, float((i + k) % 2)) for i in range(6) for k in range(4)]
    frame = pl.DataFrame(rows, schema=["prompt_id", "policy", "sample_idx", "reward"], orient="row")
    write_parquet_atomic(frame, tmp_path / "rollouts" / "reference.parquet")

    step = basis_from_rollouts(tmp_path, estimator="basis_context")
    by_key = {prompt_key(p): f for p, f in zip(problems, features, strict=True)}
    ids = sorted(by_key)
    assert step.table is not None and step.table.index is not None
    assert list(step.table.index.rows) == ids
    assert step.table.features.tolist() == [by_key[k] for k in ids]  # type: ignore[union-attr]
    plain = basis_from_rollouts(tmp_path, estimator="basis_context", features="none")
    assert plain.table is not None and plain.table.features is None
    block = {"basis": {"rollouts": str(tmp_path), "estimator": "basis_context", "features": "none"}}
    assert settings(block)["features"] == "none"
