"""`basis-bench import`: the four formats, their checks, appending, --replace, atomicity,
and the real third-party MATH500 counts when the shared data is present."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from basis_bench.cli import app
from basis_bench.errors import InputError
from basis_bench.rollouts.importers import (
    ImportOptions,
    counts,
    import_sources,
    publishing,
    write_import,
)
from basis_bench.rollouts.store import dataset_metadata, load_prompts, load_rollouts

CLI = [sys.executable, "-c", "from basis_bench.cli import main; main()"]
REAL = Path(
    os.environ.get(
        "BASIS_BENCH_REAL_DATA",
        Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "real",
    )
)
MATH500 = REAL / "limit_rlvr_qwen7b_math500"


def invoke(*args: str) -> None:
    result = CliRunner().invoke(app, ["import", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def counts_per_prompt(df: pl.DataFrame) -> dict[tuple[str, str], tuple[int, int]]:
    agg = df.group_by("policy", "prompt_id").agg(pl.len(), pl.col("reward").sum())
    return {(r[0], r[1]): (r[2], int(r[3])) for r in agg.iter_rows()}


# ------------------------------------------------------------------ counts


def test_counts_round_trip_exactly_with_prompts(tmp_path):
    src = write(
        tmp_path / "c.csv",
        "prompt_id,n,n_correct,problem,answer\np1,8,3,1+1?,2\np2,5,0,2+2?,4\np3,4,4,3+3?,6\n",
    )
    invoke("counts", str(src), "--policy", "ckpt", "--out", str(tmp_path / "ds"))
    df = load_rollouts(tmp_path / "ds")
    assert counts_per_prompt(df) == {
        ("ckpt", "p1"): (8, 3),
        ("ckpt", "p2"): (5, 0),
        ("ckpt", "p3"): (4, 4),
    }
    assert set(df["reward"].unique().to_list()) <= {0.0, 1.0}
    idx = df.group_by("prompt_id").agg(pl.col("sample_idx").sort()).sort("prompt_id")
    assert idx["sample_idx"].to_list() == [list(range(8)), list(range(5)), list(range(4))]
    prompts = load_prompts(tmp_path / "ds")
    assert prompts is not None and prompts.sort("prompt_id")["answer"].to_list() == ["2", "4", "6"]
    (meta,) = dataset_metadata(tmp_path / "ds")
    assert meta["order"] == "synthetic" and meta["kind"] == "import" and not meta["simulated"]
    assert (tmp_path / "ds" / "rollouts" / "ckpt" / "part-000000.parquet").is_file()


def test_counts_order_is_seeded_reproducible_and_independent_of_row_order(tmp_path):
    rows = [f"p{i},16,{i % 17}" for i in range(12)]
    a = write(tmp_path / "a.csv", "prompt_id,n,n_correct\n" + "\n".join(rows) + "\n")
    b = write(tmp_path / "b.csv", "prompt_id,n,n_correct\n" + "\n".join(rows[::-1]) + "\n")
    first = import_sources("counts", [a], "x", ImportOptions(seed=3)).rollouts
    again = import_sources("counts", [a], "x", ImportOptions(seed=3)).rollouts
    shuffled = import_sources("counts", [b], "x", ImportOptions(seed=3)).rollouts
    other = import_sources("counts", [a], "x", ImportOptions(seed=4)).rollouts
    key = ["prompt_id", "sample_idx"]
    assert first.sort(key).equals(again.sort(key))
    assert first.sort(key).equals(shuffled.sort(key))
    assert not first.sort(key).equals(other.sort(key))
    assert counts_per_prompt(first) == counts_per_prompt(other)
    # Two policies from the same counts get independent orders (not a shared permutation).
    y = import_sources("counts", [a], "y", ImportOptions(seed=3)).rollouts
    assert not np.array_equal(
        first.sort(key)["reward"].to_numpy(), y.sort(key)["reward"].to_numpy()
    )


def test_counts_expansion_does_not_depend_on_its_block_size(tmp_path, monkeypatch):
    rows = [f"p{i},{5 + i % 7},{i % 5}" for i in range(40)]
    src = write(tmp_path / "c.csv", "prompt_id,n,n_correct\n" + "\n".join(rows) + "\n")
    whole = import_sources("counts", [src], "x", ImportOptions(seed=3)).rollouts
    monkeypatch.setattr(counts, "BLOCK_ROWS", 12)  # blocks of one to two prompts
    blocks = import_sources("counts", [src], "x", ImportOptions(seed=3)).rollouts
    assert blocks.equals(whole)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("p1,4,5", ["c.csv:3: 'n_correct' 5 exceeds 'n' 4"]),
        ("p1,4,-1", ["c.csv:3: 'n_correct' -1 is below 0"]),
        ("p1,-4,1", ["c.csv:3: 'n' -4 is below 1"]),
        ("p1,4,1.5", ["c.csv:3: 'n_correct' 1.5 is not an integer"]),
        ("p1,four,1", ["c.csv:3: 'n' four is not an integer"]),
        ("p1,4,", ["c.csv:3: 'n_correct' has no value, expected an integer"]),
        (",4,1", ["c.csv:3: empty 'prompt_id'"]),
        ("p0,4,2", ["c.csv:3: duplicate prompt id (prompt_id='p0'), first at", "c.csv:2"]),
    ],
)
def test_counts_bad_rows_are_reported_with_file_and_line(tmp_path, body, expected):
    src = write(tmp_path / "c.csv", f"prompt_id,n,n_correct\np0,4,2\n{body}\np9,4,1\n")
    with pytest.raises(InputError) as err:
        import_sources("counts", [src], "x")
    for text in expected:
        assert text in str(err.value)
    assert "1 malformed row(s)" in str(err.value)


def test_every_bad_row_is_listed_not_just_the_first(tmp_path):
    src = write(tmp_path / "c.csv", "prompt_id,n,n_correct\na,4,9\nb,4,2\nc,2,x\nd,-1,0\n")
    with pytest.raises(InputError) as err:
        import_sources("counts", [src], "x")
    msg = str(err.value)
    assert "3 malformed row(s)" in msg
    assert all(f"c.csv:{line}:" in msg for line in (2, 4, 5))


def test_counts_from_parquet_and_jsonl_report_rows_and_lines(tmp_path):
    pq_src = tmp_path / "c.parquet"
    pl.DataFrame({"prompt_id": ["a", "b"], "n": [4, 4], "n_correct": [1, 7]}).write_parquet(pq_src)
    with pytest.raises(InputError, match=r"c\.parquet: row 2: 'n_correct' 7 exceeds 'n' 4"):
        import_sources("counts", [pq_src], "x")
    js = write(
        tmp_path / "c.jsonl",
        '{"prompt_id": "a", "n": 4, "n_correct": 1}\n\n{"prompt_id": "b", "n": 4, "n_correct": 2.5}\n',
    )
    with pytest.raises(InputError, match=r"c\.jsonl:3: 'n_correct' 2\.5 is not an integer"):
        import_sources("counts", [js], "x")
    broken = write(
        tmp_path / "d.jsonl", '{"prompt_id": "a", "n": 4, "n_correct": 1}\n{"prompt_id": \n'
    )
    with pytest.raises(InputError, match=r"d\.jsonl:2: malformed JSON"):
        import_sources("counts", [broken], "x")


def test_missing_column_names_the_option(tmp_path):
    src = write(tmp_path / "c.csv", "id,total,right\na,4,1\n")
    with pytest.raises(InputError, match=r"'prompt_id' \(--id-col\).*'n' \(--n-col\)"):
        import_sources("counts", [src], "x")
    out = import_sources(
        "counts",
        [src],
        "x",
        ImportOptions(id_col="id", n_col="total", correct_col="right"),
    )
    assert out.rollouts.height == 4


def test_id_format(tmp_path):
    src = write(tmp_path / "c.csv", "idx,n,n_correct\n7,2,1\n12,2,2\n")
    out = import_sources("counts", [src], "x", ImportOptions(id_col="idx", id_format="m_{:03d}"))
    assert sorted(out.rollouts["prompt_id"].unique().to_list()) == ["m_007", "m_012"]
    bad = write(tmp_path / "d.csv", "idx,n,n_correct\nseven,2,1\n")
    with pytest.raises(InputError, match=r"d\.csv:2: 'idx' seven is not a non-negative integer"):
        import_sources("counts", [bad], "x", ImportOptions(id_col="idx", id_format="m_{:03d}"))


# ------------------------------------------------------------------ eval-jsonl


def test_eval_jsonl_scores_responses_and_seed_files(tmp_path):
    seed0 = write(
        tmp_path / "s0.jsonl",
        json.dumps(
            {"idx": 0, "question": "1+1?", "gt": "2", "code": ["a", "b"], "score": [True, False]}
        )
        + "\n"
        + json.dumps({"idx": 1, "question": "2+2?", "gt": 4, "code": ["c", "d"], "score": [1, 1]})
        + "\n",
    )
    seed1 = write(
        tmp_path / "s1.jsonl",
        json.dumps({"idx": 0, "question": "1+1?", "gt": "2", "code": ["e"], "score": [1.0]}) + "\n",
    )
    invoke("eval-jsonl", str(seed0), str(seed1), "--policy", "rl", "--out", str(tmp_path / "ds"))
    df = load_rollouts(tmp_path / "ds")
    p0 = df.filter(pl.col("prompt_id") == "0").sort("sample_idx")
    assert p0["reward"].to_list() == [1.0, 0.0, 1.0] and p0["response"].to_list() == ["a", "b", "e"]
    assert counts_per_prompt(df)[("rl", "1")] == (2, 2)
    prompts = load_prompts(tmp_path / "ds")
    assert prompts is not None and prompts.sort("prompt_id")["answer"].to_list() == ["2", "4"]
    (meta,) = dataset_metadata(tmp_path / "ds")
    assert meta["order"] == "source"


def test_eval_jsonl_bad_lines(tmp_path):
    src = write(
        tmp_path / "e.jsonl",
        '{"idx": 0, "score": [true, false]}\n'
        '{"idx": 1, "score": [1, 0.5]}\n'
        "not json\n"
        '{"idx": 3, "score": []}\n'
        '{"idx": 4, "code": ["x"], "score": [1, 0]}\n'
        '{"idx": 0, "score": [1]}\n',
    )
    with pytest.raises(InputError) as err:
        import_sources("eval-jsonl", [src], "x")
    msg = str(err.value)
    assert "e.jsonl:3: malformed JSON" in msg
    fixed = write(
        tmp_path / "f.jsonl",
        "\n".join(line for i, line in enumerate(src.read_text().splitlines()) if i != 2) + "\n",
    )
    with pytest.raises(InputError) as err:
        import_sources("eval-jsonl", [fixed], "x")
    msg = str(err.value)
    assert "f.jsonl:2: 'score' has values other than true/false/0/1" in msg
    assert "f.jsonl:3: empty 'score' list" in msg
    assert "f.jsonl:4: 1 responses but 2 scores" in msg
    assert "f.jsonl:5: duplicate problem id in one file" in msg and "first at" in msg


# ------------------------------------------------------------------ acc-history


def test_acc_history_visits_become_policies(tmp_path):
    src = write(tmp_path / "h.json", json.dumps({"a": [0.25, 0.5, 1.0], "b": [0.0, 0.75]}))
    invoke(
        "acc-history",
        str(src),
        "--rollouts-per-visit",
        "4",
        "--policy",
        "visit",
        "--out",
        str(tmp_path / "ds"),
    )
    df = load_rollouts(tmp_path / "ds")
    assert counts_per_prompt(df) == {
        ("visit-000", "a"): (4, 1),
        ("visit-001", "a"): (4, 2),
        ("visit-002", "a"): (4, 4),
        ("visit-000", "b"): (4, 0),
        ("visit-001", "b"): (4, 3),
    }
    metas = dataset_metadata(tmp_path / "ds")
    assert metas[0]["policies"] == ["visit-000", "visit-001", "visit-002"]


def test_acc_history_means_must_be_multiples_of_one_over_g(tmp_path):
    src = write(tmp_path / "h.json", '{"a": [0.25, 0.3], "b": [1.5], "c": "high"}')
    with pytest.raises(InputError) as err:
        import_sources("acc-history", [src], "v", ImportOptions(rollouts_per_visit=4))
    msg = str(err.value)
    assert "h.json: id 'a' visit 1: mean reward 0.3 is not a multiple of 1/4" in msg
    assert "h.json: id 'b' visit 0: mean reward 1.5" in msg
    assert "h.json: id 'c': expected a list of mean rewards" in msg
    dup = write(tmp_path / "d.json", '{"a": [0.5],\n "a": [0.25]}')
    with pytest.raises(InputError, match=r"d\.json: id 'a': duplicate id"):
        import_sources("acc-history", [dup], "v", ImportOptions(rollouts_per_visit=4))
    with pytest.raises(InputError, match="--rollouts-per-visit"):
        import_sources("acc-history", [dup], "v")


# ------------------------------------------------------------------ long


def test_long_table_by_policy_with_renamed_columns(tmp_path):
    src = tmp_path / "l.parquet"
    pl.DataFrame(
        {
            "q": ["a", "a", "b", "a"],
            "who": ["m1", "m1", "m1", "m2"],
            "k": [0, 1, 0, 0],
            "r": [1.0, 0.0, 0.5, 1.0],
            "n_tokens": [3, 4, 5, 6],
        }
    ).write_parquet(src)
    cols = ["--id-col", "q", "--policy-col", "who", "--sample-col", "k", "--reward-col", "r"]
    invoke("long", str(src), "--policy", "m1", "--out", str(tmp_path / "ds"), *cols)
    invoke("long", str(src), "--policy", "m2", "--out", str(tmp_path / "ds"), *cols)
    df = load_rollouts(tmp_path / "ds")
    assert counts_per_prompt(df) == {("m1", "a"): (2, 1), ("m1", "b"): (1, 0), ("m2", "a"): (1, 1)}
    assert df["n_tokens"].sum() == 18
    bad = write(tmp_path / "b.csv", "prompt_id,sample_idx,reward\na,0,1\na,0,0\nb,x,1\nc,1,nan\n")
    with pytest.raises(InputError) as err:
        import_sources("long", [bad], "x")
    msg = str(err.value)
    assert "b.csv:3: duplicate (prompt, sample)" in msg
    assert "b.csv:4: 'sample_idx' x is not an integer" in msg
    assert "b.csv:5: 'reward' nan is not a finite number" in msg


@pytest.mark.parametrize(
    ("name", "lines", "expected"),
    [
        (
            "r.csv",
            "prompt_id,sample_idx,reward\na,0,\na,1,(empty)\na,2, \n",
            [
                "r.csv:2: 'reward' has no value, expected a finite number",
                "r.csv:3: 'reward' (empty) is not a finite number",
                "r.csv:4: 'reward' \" \" is not a finite number",
            ],
        ),
        (
            "r.jsonl",
            '{"prompt_id": "a", "sample_idx": 0, "reward": null}\n'
            '{"prompt_id": "a", "sample_idx": 1, "reward": ""}\n'
            '{"prompt_id": "a", "sample_idx": 2}\n'
            '{"prompt_id": "a", "reward": 1}\n',
            [
                "r.jsonl:1: 'reward' has no value, expected a finite number",
                "r.jsonl:2: 'reward' \"\" is not a finite number",
                "r.jsonl:3: 'reward' has no value, expected a finite number",
                "r.jsonl:4: 'sample_idx' has no value, expected an integer",
            ],
        ),
    ],
)
def test_long_says_what_a_bad_value_is(tmp_path, name, lines, expected):
    """A missing value (an empty cell, null, an absent field), an empty or blank text and
    the text "(empty)" all read "'reward' (empty) is not a finite number" (an absent field
    called empty, a blank value shown as nothing); each now says what it is."""
    with pytest.raises(InputError) as err:
        import_sources("long", [write(tmp_path / name, lines)], "x")
    listed = str(err.value).splitlines()[1:]
    assert sorted(line.strip().removeprefix(f"{tmp_path}/") for line in listed) == expected


def test_long_source_of_no_rows_is_not_said_to_name_other_policies(tmp_path):
    """A long table without a policy column and no rows says so; only a source whose
    policy column lists other policies is said to name others."""
    empty = write(tmp_path / "e.csv", "prompt_id,sample_idx,reward\n")
    with pytest.raises(
        InputError, match=r"e.csv: no rollouts to import \(the sources hold no rows\)"
    ):
        import_sources("long", [empty], "p")
    other = write(tmp_path / "o.csv", "prompt_id,policy,sample_idx,reward\na,q,0,1\n")
    with pytest.raises(InputError, match=r"no rows for policy 'p' \(the source's 'policy' column"):
        import_sources("long", [other], "p")


# ------------------------------------------------------------------ writing


def test_appending_refusing_and_replacing_a_policy(tmp_path):
    out = tmp_path / "ds"
    a = write(tmp_path / "a.csv", "prompt_id,n,n_correct\np,4,1\n")
    b = write(tmp_path / "b.csv", "prompt_id,n,n_correct\np,4,3\n")
    invoke("counts", str(a), "--policy", "ref", "--reference", "--out", str(out))
    invoke("counts", str(a), "--policy", "ck", "--out", str(out))
    with pytest.raises(InputError, match=r"already holds policy 'ck'; pass --replace"):
        write_import(import_sources("counts", [b], "ck"), out)
    proc = subprocess.run(
        [*CLI, "import", "counts", str(b), "--policy", "ck", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "already holds policy 'ck'" in proc.stderr
    assert "Traceback" not in proc.stderr
    invoke("counts", str(b), "--policy", "ck", "--out", str(out), "--replace")
    assert counts_per_prompt(load_rollouts(out)) == {("ref", "p"): (4, 1), ("ck", "p"): (4, 3)}
    refs = {m.get("reference_policy") for m in dataset_metadata(out)}
    assert refs == {"ref", None}


def test_cli_reports_a_bad_row_in_one_error_with_exit_2(tmp_path):
    src = write(tmp_path / "c.csv", "prompt_id,n,n_correct\np,4,5\n")
    proc = subprocess.run(
        [*CLI, "import", "counts", str(src), "--policy", "x", "--out", str(tmp_path / "ds")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "c.csv:2: 'n_correct' 5 exceeds 'n' 4" in proc.stderr
    assert not (tmp_path / "ds").exists()


def _parquet_and_staged(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.is_file() and (".parquet" in p.name)]


@pytest.mark.parametrize("fail_at", [1, 2, 3])
def test_interrupted_import_leaves_nothing_that_looks_complete(tmp_path, monkeypatch, fail_at):
    out = tmp_path / "ds"
    keep = write(tmp_path / "k.csv", "prompt_id,n,n_correct\np,4,1\n")
    invoke("counts", str(keep), "--policy", "old", "--out", str(out))
    before = sorted(_parquet_and_staged(out))
    src = write(tmp_path / "h.json", json.dumps({"a": [0.5, 0.25, 1.0], "b": [0.0, 0.5, 0.5]}))
    result = import_sources("acc-history", [src], "visit", ImportOptions(rollouts_per_visit=4))
    real = publishing.write_parquet_atomic
    calls = {"n": 0}

    def flaky(df, path, metadata=None):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise KeyboardInterrupt  # the user's Ctrl-C mid-way through the parts
        return real(df, path, metadata)

    monkeypatch.setattr(publishing, "write_parquet_atomic", flaky)
    with pytest.raises(KeyboardInterrupt):
        write_import(result, out)
    assert sorted(_parquet_and_staged(out)) == before  # no new part, no staged leftovers
    assert counts_per_prompt(load_rollouts(out)) == {("old", "p"): (4, 1)}


def test_interrupted_publish_takes_back_what_it_renamed(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    src = write(tmp_path / "h.json", json.dumps({"a": [0.5, 0.25, 1.0]}))
    result = import_sources("acc-history", [src], "visit", ImportOptions(rollouts_per_visit=4))
    real = os.replace
    calls = {"n": 0}

    def flaky(a, b):
        if str(a).endswith(".staged"):
            calls["n"] += 1
            if calls["n"] == 2:
                raise KeyboardInterrupt
        return real(a, b)

    monkeypatch.setattr(publishing.os, "replace", flaky)
    with pytest.raises(KeyboardInterrupt):
        write_import(result, out)
    assert _parquet_and_staged(out) == []


# ------------------------------------------------------------------ real third-party data


@pytest.mark.skipif(
    not (MATH500 / "source_counts.csv").is_file(),
    reason=f"real data not present at {MATH500} (set BASIS_BENCH_REAL_DATA to its parent)",
)
def test_real_math500_counts_import_equals_samples_and_evaluates(tmp_path):
    out = tmp_path / "math500"
    common = [
        "--id-col",
        "problem_idx",
        "--n-col",
        "n_samples",
        "--id-format",
        "math500_{:03d}",
        "--prompts",
        str(MATH500 / "prompts.parquet"),
        "--out",
        str(out),
    ]
    src = str(MATH500 / "source_counts.csv")
    invoke(
        "counts",
        src,
        "--policy",
        "qwen2.5-7b-base",
        "--correct-col",
        "base_correct",
        "--reference",
        *common,
    )
    invoke(
        "counts",
        src,
        "--policy",
        "qwen2.5-7b-simplerl-zoo",
        "--correct-col",
        "simplerl_correct",
        *common,
    )
    imported = load_rollouts(out)
    shipped = pl.read_parquet(MATH500 / "samples.parquet")
    assert imported.height == shipped.height == 128_000
    assert counts_per_prompt(imported) == counts_per_prompt(shipped)
    prompts = load_prompts(out)
    assert prompts is not None and prompts.height == 500 and "level" in prompts.columns
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--rollouts",
            str(out),
            "--estimators",
            "basis,grpo,reinforce_pp",
            "--ref-n",
            "64",
            "--oracle-n",
            "112",
            "--repeats",
            "5",
            "--no-estimates",
            "--out",
            str(tmp_path / "eval"),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    summary = pl.read_csv(tmp_path / "eval" / "summary.csv")
    assert set(summary["checkpoint"]) == {"qwen2.5-7b-simplerl-zoo"}
    assert set(summary["estimator"]) == {"basis", "grpo", "reinforce_pp"}
    assert summary["mse"].is_finite().all()


def test_evaluate_says_once_that_counts_order_is_synthetic(tmp_path):
    rows = "\n".join(f"p{i},40,{i % 41}" for i in range(40))
    src = write(tmp_path / "c.csv", "prompt_id,n,n_correct\n" + rows + "\n")
    ds = tmp_path / "ds"
    invoke("counts", str(src), "--policy", "reference", "--out", str(ds))
    invoke("counts", str(src), "--policy", "ckpt", "--out", str(ds))
    args = ["--rollouts", str(ds), "--ref-n", "16", "--oracle-n", "16", "--batch-size", "8"]
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            *args,
            "--estimators",
            "basis",
            "--repeats",
            "3",
            "--out",
            str(tmp_path / "e"),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("order: synthetic") == 1
    assert "ckpt, reference" in result.output
    run = json.loads((tmp_path / "e" / "run.json").read_text())
    assert run["synthetic_order_policies"] == ["ckpt", "reference"]
