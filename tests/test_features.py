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
