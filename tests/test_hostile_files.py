"""Files and values that once gave a traceback or a silently wrong answer (issue 35,
classes 8 and 9): each command reads them through the one shared reader or check, and each
case here is one line naming the file, or an accepted value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import EVAL_GROUP, assert_one_line_error, oracle_args, refused_import, run_main

from basis_bench.errors import InputError

DEEP = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError


# --------------------------------------------------------------------------- nested JSON


def _train_run(root: Path, config: str, log: str) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "config.json").write_text(config)
    (run / "log.jsonl").write_text(log)
    return run


@pytest.mark.parametrize("where", ["config.json", "log.jsonl"])
def test_a_deeply_nested_training_run_file_is_one_line(monkeypatch, capsys, tmp_path, where):
    config = {"estimator": "grpo", "group_size": 4, "loss": "grpo"}
    config_text = json.dumps({**config, "x": 1})
    log = '{"step": 1, "mean_reward": 0.5}\n'
    if where == "config.json":
        config_text = config_text[:-1] + f', "deep": {DEEP}}}'
    else:
        log += '{"step": 2, "deep": ' + DEEP + "}\n"
    run = _train_run(tmp_path, config_text, log)
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(run), "--out", str(out))
    assert_one_line_error(result, where, "nested")
    assert not out.exists()


def test_a_deeply_nested_run_json_and_marker_are_one_line(monkeypatch, capsys, tmp_path):
    results = tmp_path / "res"
    results.mkdir()
    (results / "run.json").write_text(DEEP)
    (results / "summary.csv").write_text("estimator,mse\nx,1\n")
    args = ["figures", "--results", str(results), "--out", str(tmp_path / "f")]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "run.json", "nested")
    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / ".basis-bench-output.json").write_text(DEEP)
    args = ["simulate", "--out", str(marked), "--prompts", "4"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "marker", "nested")


@pytest.mark.parametrize(
    ("fmt", "name", "text"),
    [
        ("acc-history", "h.json", '{"a": [0.5], "b": ' + DEEP + "}"),
        ("eval-jsonl", "e.jsonl", '{"idx": 1, "score": [1]}\n{"idx": 2, "score": ' + DEEP + "}\n"),
        ("long", "l.jsonl", '{"prompt_id": "a", "sample_idx": 0, "reward": ' + DEEP + "}\n"),
    ],
)
def test_a_deeply_nested_import_source_is_one_line(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, name, text
):
    source = tmp_path / name
    source.write_text(text)
    result = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert result.code == 2 and name in result.message and "nested" in result.message


@pytest.mark.parametrize("name", ["p.jsonl", "p.json"])
def test_a_deeply_nested_prompt_file_is_refused(tmp_path, name):
    from basis_bench.rollouts.prompts import read_records

    path = tmp_path / name
    row = '{"problem": "1+1", "answer": "2", "x": ' + DEEP + "}"
    path.write_text(row + "\n" if name.endswith("l") else f"[{row}]")
    with pytest.raises(InputError, match="nested"):
        read_records(path)


def test_parquet_metadata_that_is_not_a_json_record_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from basis_bench.guards.outputs import METADATA_KEY, read_metadata

    for raw in (DEEP, "not json", "[1, 2]"):
        table = pa.table({"x": [1]}).replace_schema_metadata({METADATA_KEY: raw})
        pq.write_table(table, tmp_path / "m.parquet")
        with pytest.raises(InputError, match=r"m\.parquet"):
            read_metadata(tmp_path / "m.parquet")


def test_the_bound_is_on_nesting_not_on_brackets_inside_strings():
    from basis_bench.guards import bounded_json

    text = json.dumps({"a": ["[" * 500, "\\[" * 10, {"b": [[1]]}], "c": '"{{{'})
    assert bounded_json.nesting(text) == 5
    assert bounded_json.loads(text)["c"] == '"{{{'
    assert bounded_json.nesting("[" * 65 + "]" * 65) == 65
    with pytest.raises(json.JSONDecodeError, match="nested 65 levels"):
        bounded_json.loads("[" * 65 + "]" * 65)
    deepest = bounded_json.loads(b"[" * 64 + b"]" * 64)
    for _ in range(63):
        (deepest,) = deepest
    assert deepest == []


# --------------------------------------------------------------------------- text to the terminal


def _dataset_with_policy(out: Path, policy: str) -> Path:
    from basis_bench.guards.outputs import write_parquet_atomic

    meta = {"kind": "oracle", "simulated": False}
    ids = ["a", "b", "c"]
    prompts = pl.DataFrame({"prompt_id": ids, "problem": ["1+1", "2+2", "3+3"], "answer": ids})
    write_parquet_atomic(prompts, out / "prompts.parquet", meta)
    for name, folder in (("reference", "reference"), (policy, "ck")):
        rows = pl.DataFrame(
            {
                "prompt_id": [p for p in ids for _ in range(8)],
                "policy": [name] * 24,
                "sample_idx": list(range(8)) * 3,
                "reward": [1.0, 0, 1, 0, 1, 0, 1, 1] * 3,
            },
            schema_overrides={"sample_idx": pl.Int32},
        )
        write_parquet_atomic(rows, out / "rollouts" / folder / "part-000000.parquet", meta)
    return out


HOSTILE_NAME = "[/bold]\x1b[31mred"  # MarkupError; an escape sequence that recolours


def test_a_policy_name_with_markup_and_escapes_prints_as_its_characters(
    monkeypatch, capsys, tmp_path
):
    data = _dataset_with_policy(tmp_path / "d", HOSTILE_NAME)
    small = ["--oracle-n", "2", "--group-size", "2", "--ref-n", "4", "--batch-size", "2"]
    args = ["evaluate", "--rollouts", str(data), "--out", str(tmp_path / "r"), *small]
    result = run_main(monkeypatch, capsys, *args, "--repeats", "2", "--estimators", "grpo,basis")
    assert result.code == 0, result.message
    assert "\x1b" not in result.out and "[/bold]\\x1b[31mred" in result.out
    bad = run_main(monkeypatch, capsys, *args, "--checkpoint", "[/bold]x\x1b[2J")
    assert_one_line_error(bad, "[/bold]x")
    assert "\x1b" not in bad.message


def test_a_warning_quoting_a_file_prints_as_its_characters(tmp_path):
    """A warning naming a prompt file (its rows without an answer are skipped) reached the
    terminal through Python's warning display, raw: an escape sequence in the name (or in
    any warning's text) recoloured it. Every warning the CLI shows is escaped as errors are."""
    toml = Path(__file__).resolve().parents[1] / "experiments" / "cpu_smollm2_arithmetic.toml"
    prompts = tmp_path / "p\x1b[31mred.jsonl"
    prompts.write_text('{"problem": "1+1", "answer": "2"}\n{"problem": "2+2", "solution": "?"}\n')
    quoted = json.dumps(str(prompts))  # a TOML string too: the escape as \u001b
    args = ["train", "--config", str(toml), "--set", f"train_prompts={quoted}", "--set",
            f"heldout_prompts={quoted}", "--set", f'run_dir="{tmp_path / "run"}"']  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "basis_bench", *args], capture_output=True,
                            text=True, env=env, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "no prompt outside train_prompts" in result.stderr
    assert "skipped 1 problem(s) with no answer" in result.stderr, result.stderr
    assert "\x1b" not in result.stderr and "p\\x1b[31mred.jsonl" in result.stderr


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize("value", ["1e-320", "1e-9"])
def test_a_temperature_too_small_to_scale_logits_is_refused(
    monkeypatch, capsys, fake_ckpt, tmp_path, value
):
    """--temperature 1e-320 overflowed the scaled logits to inf: an IndexError mid-run."""
    from basis_bench.train import make_config

    out = tmp_path / "out"
    args = oracle_args(fake_ckpt, out, "--temperature", value, "--n", "1")
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "temperature", "at least")
    assert not out.exists()
    with pytest.raises(InputError, match="temperature"):
        make_config({"temperature": float(value)})


# --------------------------------------------------------------------------- results tables


def test_figures_check_trajectory_csv_like_every_other_table(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """A hand-edited trajectory.csv was drawn although run.json holds its sha256; one
    without its scope column was a polars ColumnNotFoundError."""
    import hashlib

    res, figs = tmp_path / "res", tmp_path / "figs"
    args = [
        "evaluate",
        "--rollouts",
        str(sim_dataset),
        *EVAL_GROUP,
        "--out",
        str(res),
    ]
    assert run_main(monkeypatch, capsys, *args, "--estimators", "grpo,spo_tracker").code == 0
    table = res / "trajectory.csv"
    original = table.read_bytes()
    table.write_bytes(original.replace(b"epoch", b"epoch ", 1))
    figures = ["figures", "--results", str(res), "--out", str(figs)]
    assert_one_line_error(run_main(monkeypatch, capsys, *figures), "trajectory.csv", "changed")
    without_scope = pl.read_csv(original).drop("scope")
    without_scope.write_csv(table)
    record = json.loads((res / "run.json").read_text())
    record["tables"]["trajectory.csv"] = hashlib.sha256(table.read_bytes()).hexdigest()
    (res / "run.json").write_text(json.dumps(record))
    assert_one_line_error(run_main(monkeypatch, capsys, *figures), "trajectory.csv", "scope")
    assert not figs.exists()


# --------------------------------------------------------------------------- prompts


@pytest.mark.parametrize(
    "prompt",
    [[{"role": "user", "content": None}], [{"role": "user", "content": 5}], "x\ud800y"],
    ids=["content-None", "content-int", "lone-surrogate"],
)
def test_a_trainer_prompt_that_is_not_text_is_one_input_error(prompt):
    """content None was a TypeError; a lone surrogate a UnicodeEncodeError."""
    from basis_bench.integrations.keys import prompt_key

    with pytest.raises(InputError, match=r"content must be text|lone surrogate"):
        prompt_key(prompt)


def test_a_prompt_format_reaching_into_a_field_is_one_input_error(real_dataset):
    """{problem.foo} raised AttributeError from str.format."""
    from basis_bench.integrations.keys import keyed_reference_cache

    for fmt in ("{problem.foo}", "{problem[9999]}", "{answer:>{x}}"):
        with pytest.raises(InputError, match="prompt_format"):
            keyed_reference_cache(real_dataset, reference="ck", prompt_format=fmt)


def test_a_prompt_with_an_empty_problem_is_refused(tmp_path):
    """It was sampled on the instruction alone, without a word."""
    from basis_bench.rollouts.prompts import load_prompt_source

    path = tmp_path / "p.jsonl"
    path.write_text('{"problem": "2+2", "answer": "4"}\n{"problem": "  ", "answer": "1"}\n')
    with pytest.raises(InputError, match=r"1 prompt\(s\) with an empty problem"):
        load_prompt_source(str(path))


def test_an_instruction_that_is_not_utf8_is_refused_before_the_model(
    monkeypatch, capsys, fake_ckpt, tmp_path
):
    """A non-UTF-8 byte in argv arrives as a lone surrogate; it failed inside the model."""
    out = tmp_path / "out"
    args = oracle_args(fake_ckpt, out, "--instruction", "x\udcff")
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "instruction", "not UTF-8")
    assert not out.exists()


# --------------------------------------------------------------------------- Parquet parts

SMALL_EVAL = ["--oracle-n", "2", "--group-size", "2", "--ref-n", "4", "--batch-size", "2"]


def test_a_corrupt_page_inside_a_part_is_one_line(monkeypatch, capsys, tmp_path):
    """The footer reads, a page does not: a polars ComputeError (or arrow OSError)."""
    import pyarrow.parquet as pq

    data = _dataset_with_policy(tmp_path / "d", "late")
    part = data / "rollouts" / "ck" / "part-000000.parquet"
    raw = bytearray(part.read_bytes())
    start = pq.ParquetFile(part).metadata.row_group(0).column(3).data_page_offset
    raw[start : start + 4] = bytes(b ^ 0x5A for b in raw[start : start + 4])
    part.write_bytes(bytes(raw))
    args = ["evaluate", "--rollouts", str(data), "--out", str(tmp_path / "r"), *SMALL_EVAL]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), str(part), "not a readable")
    assert not (tmp_path / "r").exists()


def test_a_list_typed_reward_column_is_one_line(monkeypatch, capsys, tmp_path):
    from basis_bench.guards.outputs import write_parquet_atomic

    data = _dataset_with_policy(tmp_path / "d", "late")
    part = data / "rollouts" / "ck" / "part-000000.parquet"
    rows = pl.read_parquet(part).with_columns(pl.concat_list("reward").alias("reward"))
    write_parquet_atomic(rows, part, {"kind": "oracle", "simulated": False})
    args = ["evaluate", "--rollouts", str(data), "--out", str(tmp_path / "r"), *SMALL_EVAL]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), str(part), "'reward' holds List")


def test_a_gguf_cut_short_in_its_metadata_is_one_line(monkeypatch, capsys, tmp_path):
    """GGUF magic, version 3, one metadata pair whose key is cut short: struct.error."""
    import struct

    gguf = tmp_path / "m.gguf"
    header = b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 20)
    gguf.write_bytes(header + b"general.arch")
    out = tmp_path / "out"
    result = run_main(monkeypatch, capsys, *oracle_args(gguf, out))
    assert_one_line_error(result, "m.gguf", "cannot load", "corrupt")
    assert not out.exists()


def test_a_checkpoint_name_holding_mathtext_is_drawn_as_its_characters(
    monkeypatch, capsys, tmp_path
):
    """A policy named $\\frac{a$ reached matplotlib's mathtext: ValueError on savefig."""
    data = _dataset_with_policy(tmp_path / "d", "$\\frac{a$")
    res, figs = tmp_path / "r", tmp_path / "f"
    args = ["evaluate", "--rollouts", str(data), "--out", str(res), *SMALL_EVAL]
    assert run_main(monkeypatch, capsys, *args, "--estimators", "grpo,basis").code == 0
    result = run_main(monkeypatch, capsys, "figures", "--results", str(res), "--out", str(figs))
    assert result.code == 0, result.message
    assert (figs / "fig_trajectory.png").is_file()
