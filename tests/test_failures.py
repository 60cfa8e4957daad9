"""Outputs that never lie (issue 14, the commands outside the value benchmark): no command
writes into another's folder, one atomic writer, and a one-line error (no traceback, no
changed byte of earlier data) for every failure a user can provoke.

Every CLI case runs in this process through ``basis_bench.cli.main`` (the real entry point
with its error handling), so the tier stays fast; no case loads a real model.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import assert_one_line_error, refused_import, run_main, snapshot

from basis_bench.cli.app import after_failure
from basis_bench.errors import InputError
from basis_bench.evaluation.figures import make_figures
from basis_bench.outputs import (
    LOCK_FILE,
    OUTPUT_MARKER,
    atomic_write,
    claim_output_dir,
    read_output_marker,
    recognise_output,
    write_parquet_atomic,
)
from basis_bench.rollouts.simulate import SimulationConfig, simulate
from basis_bench.rollouts.store import load_rollouts

SIMULATED = Path(__file__).resolve().parents[1] / "data" / "simulated"
SMALL_SIM = ["--prompts", "12", "--ref-n", "4", "--checkpoint-n", "6"]


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str) -> Iterator[bool]:
    """A tmpfs at ``path`` when this machine lets us mount one (root in a container that
    allows it); yields whether it is mounted. Unmounted lazily: the command under test ran
    in this process and keeps its lock file there open, so a plain umount fails (busy) and
    left one mount per run behind."""
    path.mkdir(parents=True, exist_ok=True)
    ok = (
        shutil.which("mount") is not None
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    try:
        yield ok
    finally:
        if ok:
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=True)


# --------------------------------------------------------------------------- claim_output_dir


def test_new_empty_and_own_folders_are_claimed_and_marked(tmp_path):
    new = claim_output_dir(tmp_path / "a" / "b", "rollouts", simulated=False)
    assert new.is_dir() and read_output_marker(new)["kind"] == "rollouts"
    assert read_output_marker(new)["simulated"] is False
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / f".x.parquet.{uuid.uuid4().hex}.tmp").write_text("a writer's temporary file")
    claim_output_dir(empty, "train-run")
    before = (empty / OUTPUT_MARKER).stat().st_mtime_ns
    claim_output_dir(empty, "train-run")  # its own kind: fine, marker not rewritten
    assert (empty / OUTPUT_MARKER).stat().st_mtime_ns == before


def test_other_kinds_foreign_files_and_files_are_refused(tmp_path, sim_dataset):
    run = claim_output_dir(tmp_path / "run", "train-run")
    with pytest.raises(InputError, match=r"already holds a training run, not a rollouts dataset"):
        claim_output_dir(run, "rollouts")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match=r"no basis-bench output \(e\.g\. 'notes\.txt'\)"):
        claim_output_dir(foreign, "rollouts")
    claim_output_dir(tmp_path / "parent" / "default", "figures")  # its marker was named
    with pytest.raises(InputError, match=r"other basis-bench output in a subfolder \('default/'\)"):
        claim_output_dir(tmp_path / "parent", "figures")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        claim_output_dir(tmp_path / "file", "rollouts", force=True)
    with pytest.raises(InputError, match="would mix the two"):
        claim_output_dir(sim_dataset, "rollouts", simulated=False)
    claim_output_dir(sim_dataset, "rollouts")  # simulated=None: either kind of data
    claim_output_dir(sim_dataset, "rollouts", simulated=False, force=True)
    assert read_output_marker(sim_dataset)["simulated"] == "mixed"


def test_commands_without_force_do_not_suggest_it(monkeypatch, capsys, sim_dataset, tmp_path):
    """evaluate, sensitivity and figures have no --force: their refusals said "pass --force",
    and doing so was a usage error."""
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    small = ["--rollouts", str(sim_dataset), "--repeats", "2", "--oracle-n", "2", "--ref-n", "4"]
    small += ["--batch-size", "4"]
    evaluate = ["evaluate", *small, "--group-size", "2", "--no-trajectory"]
    res = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate, "--out", str(res)).code == 0
    runs = [
        [*evaluate, "--out", str(foreign)],
        ["sensitivity", *small, "--out", str(foreign)],
        ["figures", "--results", str(res), "--out", str(foreign)],
    ]
    for args in runs:
        result = run_main(monkeypatch, capsys, *args)
        assert_one_line_error(result, "no basis-bench output", "choose a new or empty folder")
        assert "--force" not in result.message
    (foreign / "notes.txt").unlink()
    (foreign / OUTPUT_MARKER).write_text("{not json")
    result = run_main(monkeypatch, capsys, *runs[0])
    assert_one_line_error(result, "is not a valid marker", "delete it")
    assert "--force" not in result.message
    with pytest.raises(InputError, match="delete it, or pass --force"):
        claim_output_dir(foreign, "rollouts")  # commands with --force still suggest it


def test_an_out_starting_with_a_literal_tilde_is_refused(monkeypatch, tmp_path):
    """--out=~/x (not expanded after '=') made a folder named ~ in the current one."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"--out ~/x starts with a literal ~.*--out /"):
        claim_output_dir(Path("~/x"), "rollouts")
    assert not (tmp_path / "~").exists()
    (tmp_path / "~").mkdir()  # a folder the user named so on purpose
    assert claim_output_dir(Path("~/x"), "rollouts") == tmp_path / "~" / "x"


def test_a_dataset_inside_another_is_refused(
    monkeypatch, capsys, real_dataset, sim_dataset, tmp_path
):
    """import --out DATASET/rollouts wrote a nested dataset: its rows were read as the outer
    one's, its prompts.parquet was not."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,3\n")
    before = snapshot(real_dataset)
    for inner in (real_dataset / "rollouts", real_dataset / "more"):
        code, message = import_into(monkeypatch, capsys, inner, "counts", source)
        assert code == 2 and f"is inside the rollouts dataset {real_dataset}" in message
    assert snapshot(real_dataset) == before
    with pytest.raises(InputError, match="inside the rollouts dataset"):
        claim_output_dir(sim_dataset / "rollouts", "rollouts")  # by its marker
    claim_output_dir(sim_dataset / "rollouts", "rollouts", force=True)


def test_datasets_without_a_marker_are_recognised_by_their_files(real_dataset, tmp_path):
    shipped = tmp_path / "shipped"
    shutil.copytree(SIMULATED, shipped)  # the repository's simulated dataset (no marker)
    (shipped / OUTPUT_MARKER).unlink(missing_ok=True)
    assert recognise_output(shipped) == {"kind": "rollouts", "simulated": True}
    claim_output_dir(shipped, "rollouts", simulated=True)
    assert recognise_output(real_dataset) == {"kind": "rollouts", "simulated": False}
    claim_output_dir(real_dataset, "rollouts", simulated=False)  # adopted: a marker is added
    assert read_output_marker(real_dataset)["simulated"] is False
    legacy = tmp_path / "legacy-sim"
    simulate(SimulationConfig(n_prompts=4, ref_n=2, checkpoint_n=2), legacy)
    (legacy / OUTPUT_MARKER).unlink()
    assert recognise_output(legacy) == {"kind": "rollouts", "simulated": True}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.parquet").write_text("not parquet")
    assert recognise_output(bad) == {"kind": None, "example": "x.parquet"}
    (bad / "x.parquet").unlink()
    (bad / "y.parquet").mkdir()  # a folder named like a Parquet file: not a file, ignored
    assert recognise_output(bad) is None
    (real_dataset / OUTPUT_MARKER).write_text("{not json")
    with pytest.raises(InputError, match="not a valid marker"):
        claim_output_dir(real_dataset, "rollouts")


# --------------------------------------------------------------------------- simulate


def test_simulate_refuses_a_real_dataset_and_changes_no_byte(
    monkeypatch, capsys, real_dataset, tmp_path
):
    before = snapshot(real_dataset)
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(real_dataset), *SMALL_SIM)
    assert_one_line_error(result, str(real_dataset), "real rollouts", "--force")
    assert snapshot(real_dataset) == before
    (tmp_path / "file").write_text("x")
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(tmp_path / "file"))
    assert_one_line_error(result, "is a file")


def test_simulate_rerun_replaces_its_own_dataset_whole(tmp_path):
    out = tmp_path / "sim"
    simulate(SimulationConfig(n_prompts=6, ref_n=2, checkpoint_n=2), out)
    assert (out / "rollouts" / "middle.parquet").is_file()
    simulate(SimulationConfig(n_prompts=4, ref_n=2, checkpoint_n=2, stages={"a": 1.0}), out)
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == [
        "a.parquet",
        "reference.parquet",
    ]
    assert load_rollouts(out)["prompt_id"].n_unique() == 4


# --------------------------------------------------------------------------- import


def test_import_refuses_a_simulated_dataset_and_a_training_run(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    counts = tmp_path / "c.csv"
    counts.write_text("prompt_id,n,n_correct\nsim-00,4,1\n")
    before = snapshot(sim_dataset)
    args = ["import", "counts", str(counts), "--policy", "ck", "--out"]
    result = run_main(monkeypatch, capsys, *args, str(sim_dataset))
    assert_one_line_error(result, "simulated rollouts", "would mix")
    assert snapshot(sim_dataset) == before
    run = claim_output_dir(tmp_path / "run", "train-run")
    assert_one_line_error(run_main(monkeypatch, capsys, *args, str(run)), "training run")
    assert run_main(monkeypatch, capsys, *args, str(run), "--force")[0] == 0


def import_into(
    monkeypatch, capsys, dataset: Path, fmt: str, source: Path, *extra: str
) -> tuple[int, str]:
    """Import ``source`` as a new policy into ``dataset``: (exit code, last stderr line)."""
    args = ["import", fmt, str(source), "--policy", "new", "--out", str(dataset), *extra]
    code, message, _ = run_main(monkeypatch, capsys, *args)
    return code, message


NOT_UTF8 = [  # (format, file name, bytes with a Latin-1 byte on line 3)
    ("counts", "c.csv", b"prompt_id,n,n_correct\na,4,1\ncaf\xe9,4,2\n"),
    ("counts", "c.tsv", b"prompt_id\tn\tn_correct\na\t4\t1\ncaf\xe9\t4\t2\n"),
    ("counts", "c.jsonl", b'{"prompt_id":"a","n":4,"n_correct":1}\n\n{"prompt_id":"caf\xe9"}\n'),
    ("eval-jsonl", "e.jsonl", b'{"idx":1,"score":[true]}\n\n{"idx":"caf\xe9","score":[true]}\n'),
    ("long", "l.csv", b"prompt_id,sample_idx,reward\na,0,1\ncaf\xe9,0,1\n"),
    ("acc-history", "h.json", b'{"a": [0.5],\n "b": [0.25],\n "caf\xe9": [1.0]}\n'),
]  # fmt: skip


@pytest.mark.parametrize("fmt, name, data", NOT_UTF8, ids=[f"{f}-{n}" for f, n, _ in NOT_UTF8])
def test_import_refuses_text_that_is_not_utf8_naming_the_line(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, name, data
):
    """Replacement characters would let two distinct ids collide: refused, not coerced."""
    source = tmp_path / name
    source.write_bytes(data)
    result = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert_one_line_error(result, f"{source}:3: not UTF-8 text", "0xe9")


def test_import_refuses_parquet_bytes_lists_and_wild_id_formats(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """Each once a polars traceback: a byte-string id that is not UTF-8, a list where one
    value per row belongs, a zero-padding width of a trillion digits."""
    before = snapshot(real_dataset)
    binary = tmp_path / "b.parquet"
    pl.DataFrame({"prompt_id": [b"a", b"caf\xe9"], "n": [4, 4], "n_correct": [1, 2]}).write_parquet(
        binary
    )
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(binary), "--policy", "new",
        "--out", str(real_dataset),
    )  # fmt: skip
    assert_one_line_error(result, f"{binary}: row 2: column 'prompt_id' is not UTF-8 text")
    lists = tmp_path / "l.parquet"
    pl.DataFrame({"prompt_id": ["a"], "sample_idx": [0], "reward": [[1.0]]}).write_parquet(lists)
    result = run_main(
        monkeypatch, capsys, "import", "long", str(lists), "--policy", "new",
        "--out", str(real_dataset),
    )  # fmt: skip
    assert_one_line_error(result, "column 'reward' holds List(Float64), not one value per row")
    counts = tmp_path / "c.csv"
    counts.write_text("prompt_id,n,n_correct\n7,4,1\n")
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(counts), "--policy", "new",
        "--out", str(real_dataset), "--id-format", "p{:0999999999999d}",
    )  # fmt: skip
    assert_one_line_error(result, "--id-format", "N up to 64")
    assert snapshot(real_dataset) == before
    pl.DataFrame({"prompt_id": [b"a"], "n": [4], "n_correct": [1]}).write_parquet(binary)
    assert import_into(monkeypatch, capsys, real_dataset, "counts", binary)[0] == 0


ODD_IDS = {  # (format, file name, text, what the error says at which line)
    "int beside text": (
        "eval-jsonl", "e.jsonl", '{"idx":7,"score":[1]}\n{"idx":"8","score":[0]}\n',
        ':2: \'idx\' "8" is text but the file\'s first id is an integer',
    ),
    "text beside int": (
        "counts", "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":1}\n{"prompt_id":8,"n":4,"n_correct":1}\n',
        ":2: 'prompt_id' 8 is an integer but the file's first id is text",
    ),
    "float": ("eval-jsonl", "e.jsonl", '{"idx":7.0,"score":[1]}\n', ":1: 'idx' 7.0 is not text"),
    "boolean": (
        "eval-jsonl", "e.jsonl", '{"idx":1,"score":[1]}\n{"idx":true,"score":[1]}\n',
        ":2: 'idx' true is not text or an integer",
    ),
    "list": (
        "long", "l.jsonl",
        '{"prompt_id":1,"sample_idx":0,"reward":1}\n{"prompt_id":[1],"sample_idx":0,"reward":1}\n',
        ":2: 'prompt_id' [1] is not text or an integer",
    ),
    "padded csv": (
        "counts", "c.csv", "prompt_id,n,n_correct\na,4,1\n a,4,2\n",
        ":3: 'prompt_id' \" a\" has leading or trailing whitespace (ids are used exactly)",
    ),
    "padded jsonl": (
        "eval-jsonl", "e.jsonl", '{"idx":"a ","score":[1]}\n',
        ":1: 'idx' \"a \" has leading or trailing whitespace",
    ),
    "padded key": (
        "acc-history", "h.json", '{"a": [0.5], "b\\t": [0.25]}',
        ": id 'b\\t': 'id' \"b\\t\" has leading or trailing whitespace",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ODD_IDS))
def test_import_uses_ids_exactly_or_refuses_them_naming_the_line(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """An id is text (used as it is, never stripped) or an integer (its decimal digits); an
    integer 7 beside a text "7" in one file, a float, boolean or list id, and padded text
    were once read as text ("7", "true", "a"), so distinct ids could collide."""
    fmt, name, text, needle = ODD_IDS[case]
    source = tmp_path / name
    source.write_text(text)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}{needle}" in message, message


def test_import_reads_integer_ids_as_their_digits(monkeypatch, capsys, real_dataset, tmp_path):
    """The documented eval-jsonl shape (integer ``idx``) and an integer Parquet id column
    give the same prompt ids as text "0", "1"; a float id column is refused by row."""
    lines = tmp_path / "e.jsonl"
    lines.write_text('{"idx":0,"score":[true,false]}\n{"idx":1,"score":[1,1]}\n')
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", lines)[0] == 0
    ids = load_rollouts(real_dataset, ["new"])["prompt_id"].unique().sort().to_list()
    assert ids == ["0", "1"]
    table = tmp_path / "c.parquet"
    pl.DataFrame({"prompt_id": [0, 1], "n": [4, 4], "n_correct": [1, 2]}).write_parquet(table)
    args = ["import", "counts", str(table), "--policy", "ints", "--out", str(real_dataset)]
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert load_rollouts(real_dataset, ["ints"])["prompt_id"].unique().sort().to_list() == ids
    pl.DataFrame({"prompt_id": [0.0], "n": [4], "n_correct": [1]}).write_parquet(table)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", table)
    assert code == 2 and f"{table}: row 1: 'prompt_id' 0.0 is not text" in message, message


def test_import_refuses_a_second_reference_policy(monkeypatch, capsys, real_dataset, tmp_path):
    """Once written silently: files that disagree on the reference make every later evaluate
    stop ("files disagree on the reference policy"). Replacing the reference itself is fine."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,2\n")
    assert import_into(monkeypatch, capsys, real_dataset, "counts", source, "--reference")[0] == 0
    before = snapshot(real_dataset)
    args = ["import", "counts", str(source), "--out", str(real_dataset), "--reference"]
    result = run_main(monkeypatch, capsys, *args, "--policy", "other")
    assert_one_line_error(result, "already names 'new' as its reference policy", "rollouts/new/")
    assert snapshot(real_dataset) == before
    assert run_main(monkeypatch, capsys, *args, "--policy", "new", "--replace").code == 0


BOOLEAN_COUNTS = {  # a boolean where an integer count belongs, in every reader
    "first line": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":true}\n{"prompt_id":"b","n":4,"n_correct":2}\n',
        ":1: 'n_correct' true is not an integer",
    ),
    "later line": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":2}\n{"prompt_id":"b","n":4,"n_correct":true}\n',
        ":2: 'n_correct' true is not an integer",
    ),
    "every line": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":true}\n{"prompt_id":"b","n":4,"n_correct":false}\n',
        ":2: 'n_correct' is a boolean, expected an integer",
    ),
    "n": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":1}\n{"prompt_id":"b","n":true,"n_correct":1}\n',
        ":2: 'n' true is not an integer",
    ),
    "csv": ("c.csv", "prompt_id,n,n_correct\na,4,1\nb,4,true\n", ":3: 'n_correct' true is not"),
}


@pytest.mark.parametrize("case", sorted(BOOLEAN_COUNTS))
def test_import_refuses_a_boolean_among_integer_counts(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    name, text, needle = BOOLEAN_COUNTS[case]
    source = tmp_path / name
    source.write_text(text)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, "counts", source)
    assert code == 2 and f"{source}{needle}" in message, message


def test_import_refuses_booleans_in_a_parquet_count_and_a_long_jsonl(
    monkeypatch, capsys, real_dataset, tmp_path
):
    before = snapshot(real_dataset)
    parquet = tmp_path / "c.parquet"
    pl.DataFrame({"prompt_id": ["a"], "n": [4], "n_correct": [True]}).write_parquet(parquet)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", parquet)
    assert code == 2 and f"{parquet}: row 1: 'n_correct' is a boolean" in message, message
    long = tmp_path / "l.jsonl"
    long.write_text(
        '{"prompt_id":"a","sample_idx":0,"reward":1}\n'
        '{"prompt_id":"a","sample_idx":true,"reward":0.5}\n'
        '{"prompt_id":"b","sample_idx":0,"reward":true}\n'
    )
    code, message = run_main(
        monkeypatch, capsys, "import", "long", str(long), "--policy", "new",
        "--out", str(real_dataset),
    )[:2]  # fmt: skip
    assert code == 2 and f"{long}:3: 'reward' true is not a finite number" in message, message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_long_import_refuses_a_reward_column_of_booleans(
    monkeypatch, capsys, real_dataset, tmp_path, suffix
):
    """Every reward a boolean was once read as 1.0/0.0 (only a boolean among numbers was
    refused): a reward is a number in every format, as in CSV."""
    rows = pl.DataFrame({"prompt_id": ["a", "b"], "sample_idx": [0, 0], "reward": [True, False]})
    source = tmp_path / f"l{suffix}"
    if suffix == ".parquet":
        rows.write_parquet(source)
    else:
        rows.write_ndjson(source)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, "long", source)
    where = f"{source}: row 2" if suffix == ".parquet" else f"{source}:2"
    assert code == 2 and f"{where}: 'reward' false is not a finite number" in message, message


@pytest.mark.parametrize(
    "fmt, text, needle",
    [
        ("long", "prompt_id,sample_idx,reward\na,0,1\na,3000000000,0\n",
         ":3: 'sample_idx' 3000000000 is above 2147483647"),
        ("counts", "prompt_id,n,n_correct\na,4,1\nb,1000000000000,2\n",
         ":3: 'n' 1000000000000 is above 2147483647"),
        ("counts", "prompt_id,n,n_correct\na,-1e30,1\n", ":2: 'n' -1e30 is below 1"),
    ],
)  # fmt: skip
def test_import_refuses_integers_the_store_cannot_hold(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, text, needle
):
    """A sample index is Int32: larger ones (or counts that would make them) are refused by
    line, not a polars overflow or a 7 TiB allocation."""
    source = tmp_path / "s.csv"
    source.write_text(text)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}{needle}" in message, message


def test_import_refuses_counts_that_cannot_fit_in_memory_before_allocating(
    monkeypatch, capsys, real_dataset, tmp_path
):
    source = tmp_path / "c.csv"  # 40 x 2e9 = 8e10 rollouts: terabytes, on any machine
    source.write_text(
        "prompt_id,n,n_correct\n" + "".join(f"p{i},2000000000,1\n" for i in range(40))
    )
    history = tmp_path / "h.json"
    history.write_text('{"a": [0.5, 0.5, 0.5]}')
    before = snapshot(real_dataset)
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(source), "--policy", "new",
        "--out", str(real_dataset),
    )  # fmt: skip
    assert_one_line_error(result, "makes 80,000,000,000 rollouts", "GiB of memory is free")
    result = run_main(
        monkeypatch, capsys, "import", "acc-history", str(history), "--policy", "new",
        "--out", str(real_dataset), "--rollouts-per-visit", "1000000000000",
    )  # fmt: skip
    assert_one_line_error(result, "--rollouts-per-visit must be in [1, 2147483647]")
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize(
    "fmt, name, text",
    [
        ("counts", "c.csv", "prompt_id,n,n_correct\n"),
        ("counts", "c.tsv", "prompt_id\tn\tn_correct\n"),
        ("acc-history", "h.json", "{}"),
        ("acc-history", "h.json", '{"a": [], "b": []}'),
    ],
)
def test_import_refuses_a_source_without_rows(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, name, text
):
    source = tmp_path / name
    source.write_text(text)
    result = refused_import(monkeypatch, capsys, tmp_path / "fresh", fmt, source)
    assert_one_line_error(result, "no rollouts to import")
    assert not (tmp_path / "fresh").exists()
    result = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert_one_line_error(result, "no rollouts to import")
    parquet = tmp_path / "empty.parquet"
    pl.DataFrame(
        schema={"prompt_id": pl.String, "n": pl.Int64, "n_correct": pl.Int64}
    ).write_parquet(parquet)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", parquet)
    assert code == 2 and "no rollouts to import" in message


# --------------------------------------------------------------------------- oracle


class FakeSampler:
    """Answers every prompt with a long fixed text: parts are big, no model is loaded."""

    def __init__(self, text: str = "x" * 2000) -> None:
        self.text = text

    def sample(self, problems, config, seed, on_progress=None):
        from basis_bench.rollouts.sampling.base import Samples

        count = len(problems) * config.n
        rng = np.random.default_rng(seed)
        texts = [self.text + rng.bytes(3000).hex() for _ in range(count)]
        return Samples(texts, np.full(count, 7, dtype=np.int32), ["length"] * count)

    def describe(self) -> dict[str, Any]:
        return {"backend": "fake"}


def oracle_args(ckpt: Path, out: Path, *extra: str) -> list[str]:
    # one worker: the fakes patched in below live in this process
    return [
        "oracle", "--model", str(ckpt), "--policy", "p", "--prompts", "arithmetic:n=40,seed=3",
        "--n", "2", "--chunk-size", "1", "--device", "cpu", "--workers", "1", "--out", str(out),
        *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # the wording of settings.check_scalar, the one range checker
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1"),
        (["--temperature", "nan"], "--temperature must be a number, not NaN"),
        (["--temperature", "inf"], "--temperature must be finite"),
        (["--verify-timeout", "nan"], "--verify-timeout must be a number, not NaN"),
        (["--verify-timeout", "inf"], "--verify-timeout must be finite"),
        (["--top-p", "nan"], "--top-p must be a number, not NaN"),
    ],
)
def test_oracle_options_are_refused_before_anything_is_written(
    monkeypatch, capsys, fake_ckpt, tmp_path, extra, needle
):
    out = tmp_path / "out"
    assert_one_line_error(
        run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, out, *extra)), needle
    )
    assert not out.exists()


def test_oracle_refuses_a_non_utf8_prompt_file(monkeypatch, capsys, fake_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(
        b'{"problem": "1+1", "answer": "2"}\n{"problem": "\xff\xfe", "answer": "1"}\n'
    )
    args = oracle_args(fake_ckpt, tmp_path / "out")
    args[args.index("--prompts") + 1] = str(prompts)
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "p.jsonl:2", "not UTF-8")


@pytest.mark.parametrize("broken", ["config.json", "model.safetensors", "fake.gguf"])
def test_oracle_names_a_corrupt_checkpoint(monkeypatch, capsys, tmp_path, broken):
    from transformers import LlamaConfig

    ckpt = tmp_path / "ckpt"
    LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    ).save_pretrained(ckpt)  # fmt: skip
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    target = ckpt
    if broken == "config.json":
        (ckpt / "config.json").write_text("{garbage")
    elif broken == "fake.gguf":
        target = tmp_path / "fake.gguf"
        target.write_text("not a gguf file")
    out = tmp_path / "out"
    result = run_main(monkeypatch, capsys, *oracle_args(target, out))
    assert_one_line_error(result, str(target.resolve()), "cannot load the model", "corrupt")


# A Llama small enough to build (the defaults make 6.5B parameters, refused before building).
TINY_LLAMA = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}  # fmt: skip


def test_an_oracle_whose_model_cannot_load_writes_nothing(
    monkeypatch, capsys, tmp_path, real_dataset
):
    """The model loads before prompts.parquet is merged: a corrupt checkpoint leaves the
    dataset's bytes as they were."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(TINY_LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    claim_output_dir(real_dataset, "rollouts", simulated=False)  # as an earlier run left it
    before = snapshot(real_dataset)
    assert "prompts.parquet" in before
    result = run_main(monkeypatch, capsys, *oracle_args(ckpt, real_dataset))
    assert_one_line_error(result, "cannot load the model")
    assert snapshot(real_dataset) == before


# with 2 workers the model loads in spawned processes (about 15 s on the shared machine)
@pytest.mark.parametrize(("workers", "given"), [("1", "empty"), ("2", "new")])
def test_an_oracle_whose_model_cannot_load_leaves_the_out_folder_as_it_was(
    monkeypatch, capsys, tmp_path, workers, given
):
    """The claim (marker, lock file) and, with workers, prompts.parquet were written before
    the model loaded: a failed start left a claimed folder. Now a new --out is removed again
    and an empty one stays empty (its own subfolder kept)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(TINY_LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    out = tmp_path / "out"
    if given == "empty":
        (out / "mine").mkdir(parents=True)
    args = oracle_args(ckpt, out)
    args[args.index("--workers") + 1] = workers
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "cannot load the model")
    assert (
        sorted(p.name for p in out.iterdir()) == ["mine"] if given == "empty" else not out.exists()
    )
    fresh = claim_output_dir(out, "rollouts", simulated=False)  # and the next claim is clean
    assert read_output_marker(fresh)["kind"] == "rollouts"


def test_oracle_refuses_a_simulated_dataset(monkeypatch, capsys, fake_ckpt, sim_dataset):
    before = snapshot(sim_dataset)
    result = run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, sim_dataset))
    assert_one_line_error(result, "simulated rollouts", "would mix")
    assert snapshot(sim_dataset) == before


def test_oracle_on_a_read_only_out_is_one_line(monkeypatch, capsys, fake_ckpt, tmp_path):
    ro = tmp_path / "ro"
    with mounted_tmpfs(ro, "ro,size=64k") as mounted:
        if not mounted:
            if os.geteuid() == 0:
                pytest.skip("cannot mount a read-only tmpfs, and root ignores file modes")
            ro.chmod(0o555)
        result = run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, ro / "out"))
        with contextlib.suppress(OSError):
            ro.chmod(0o755)
    assert not ro.is_mount()
    assert_one_line_error(result, "ro/out", "rerun the same command to resume", code=1)
    assert ("read-only" in result[1]) or ("permission denied" in result[1])


def test_oracle_disk_full_keeps_completed_parts_valid(monkeypatch, capsys, fake_ckpt, tmp_path):
    """Disk full mid-run: one line, exit 1, every part on disk loads, no temporary file is
    left, and a rerun with space resumes and completes the dataset."""
    import basis_bench.rollouts.oracle_chunks as oracle_module
    import basis_bench.rollouts.sampling as sampling

    monkeypatch.setattr(sampling, "make_sampler", lambda *a, **k: FakeSampler())
    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, "size=160k") as mounted:
        if not mounted:  # no tmpfs here: the writer fails as a full disk would, after part 6
            real, calls = oracle_module.write_parquet_atomic, []

            def full_after_six(df, path, metadata=None):
                calls.append(path)
                if len(calls) > 6:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                return real(df, path, metadata)

            monkeypatch.setattr(oracle_module, "write_parquet_atomic", full_after_six)
        out = disk / "out"
        result = run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, out))
        assert_one_line_error(result, "no space left", "completed parts are kept", code=1)
        parts = sorted((out / "rollouts" / "p").glob("part-*.parquet"))
        assert 0 < len(parts) < 40
        assert load_rollouts(out)["prompt_id"].n_unique() == len(parts)
        assert not [f for f in out.rglob("*") if f.name.endswith((".tmp", ".staged"))]
        kept = snapshot(out / "rollouts")
        shutil.copytree(out, tmp_path / "out")
    assert not disk.is_mount()
    monkeypatch.setattr(oracle_module, "write_parquet_atomic", write_parquet_atomic)
    assert run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, tmp_path / "out"))[0] == 0
    assert load_rollouts(tmp_path / "out")["prompt_id"].n_unique() == 40
    after = snapshot(tmp_path / "out" / "rollouts")
    assert {k: after[k] for k in kept} == kept  # the completed parts were not rewritten


# --------------------------------------------------------------------------- train


def write_toml(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"a.toml": 'extends = "b.toml"', "b.toml": 'extends = "a.toml"'}, "extend each other in a loop"),
        ({"a.toml": 'extends = "a.toml"'}, "extend each other in a loop"),
        ({"a.toml": "estimator_options = 5"}, "'estimator_options' must be dict"),
        ({"a.toml": 'estimator = "grpo"\nestimator_options = {bogus = 1}'}, "unknown option(s) bogus for estimator 'grpo'"),
        ({"a.toml": "estimator_options = {bogus = 1}"}, "unknown option(s) bogus for estimator 'basis'"),
        ({"a.toml": "top_p = 1.5"}, "top_p must be in (0, 1]; got 1.5"),
        ({"a.toml": "lr = inf"}, "lr must be finite; got inf"),
        ({"a.toml": "lr = nan"}, "lr must be a number, not NaN"),
    ],
)  # fmt: skip
def test_train_config_mistakes_are_one_line_before_any_model_loads(
    monkeypatch, capsys, tmp_path, files, needle
):
    import basis_bench.train.setup as setup

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(setup, "load_models", no_load)
    for name, text in files.items():
        write_toml(tmp_path / name, f'run_dir = "{tmp_path / "run"}"\n{text}\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(tmp_path / "a.toml"))
    assert_one_line_error(result, needle)


def test_train_refuses_a_dataset_as_run_dir(monkeypatch, capsys, tmp_path, real_dataset):
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    before = snapshot(real_dataset)
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{real_dataset}"\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert_one_line_error(result, "run_dir", "real rollouts, not a training run", "--force")
    assert snapshot(real_dataset) == before


def test_resume_refuses_truncated_garbage_and_partial_checkpoints(monkeypatch, capsys, tmp_path):
    import torch

    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE, load_trainer_state

    ckpt = tmp_path / "run" / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    state = {"step": 1, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    torch.save({**state, "config": vars(make_config({}))}, ckpt / TRAINER_STATE)
    whole = (ckpt / TRAINER_STATE).read_bytes()
    assert load_trainer_state(ckpt)["step"] == 1
    cases = {
        "truncated": (whole[: len(whole) // 2], "truncated or corrupt"),
        "garbage": (b"garbage\n" * 10, "not a trainer state written by basis-bench"),
        "empty": (b"", "truncated or corrupt"),
    }
    for data, needle in cases.values():
        (ckpt / TRAINER_STATE).write_bytes(data)
        result = run_main(monkeypatch, capsys, "train", "--resume", str(ckpt))
        assert_one_line_error(result, str(ckpt), TRAINER_STATE, needle)
    torch.save([1, 2, 3], ckpt / TRAINER_STATE)
    assert_one_line_error(
        run_main(monkeypatch, capsys, "train", "--resume", str(ckpt)), "lacks step, config"
    )
    partial = ckpt.with_name("step-000002.partial")
    shutil.copytree(ckpt, partial)
    assert_one_line_error(
        run_main(monkeypatch, capsys, "train", "--resume", str(partial)), "unfinished checkpoint"
    )
    torch.save({**state, "config": vars(make_config({}))}, ckpt / TRAINER_STATE)
    for wrong in (ckpt.with_name("step-1"), tmp_path / "run"):  # a short name; the run itself
        result = run_main(monkeypatch, capsys, "train", "--resume", str(wrong))
        assert_one_line_error(result, f"no {TRAINER_STATE} there", f"found: {ckpt}")
        assert ".partial" not in result[1]


@pytest.mark.parametrize(
    "edit",
    [
        {"step": -3},
        {"step": "abc"},
        {"step": True},
        {"step": 2.0},
        {"config": "abc"},
        {"config": {1: 2}},
        {"optimizer": "abc"},
        {"rng": {"torch": "abc"}},
        {"rng": None},
        {"basis_previous_index": -1},
        {"estimator_state": [1, 2]},
    ],
    ids=lambda e: "-".join(f"{k}={v!r}" for k, v in e.items()),
)
def test_resume_checks_the_whole_trainer_state_before_writing(monkeypatch, capsys, tmp_path, edit):
    """Issue 35: a state with step=-3 emptied log.jsonl, then raised; config="abc" or
    step="abc" raised tracebacks. Every field is checked before a model loads or a file is
    written."""
    import torch

    import basis_bench.train.setup as setup
    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    log = tmp_path / "run" / "log.jsonl"
    log.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    state = {"step": 2, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    torch.save({**state, "config": vars(make_config({})), **edit}, ckpt / TRAINER_STATE)
    before = snapshot(tmp_path / "run")
    result = run_main(monkeypatch, capsys, "train", "--resume", str(ckpt))
    assert_one_line_error(result, TRAINER_STATE, f"{next(iter(edit))} = ")
    assert snapshot(tmp_path / "run") == before


def test_an_estimator_state_off_its_beta_grid_is_refused():
    """A ``basis_previous_index`` past the grid was stored and indexed at the next step."""
    from basis_bench.estimators import make_step_estimator
    from basis_bench.train.checkpoint import load_estimator_state

    ids, cache = ["a", "b"], np.array([[1.0, 0.0], [0.0, 1.0]])
    step = make_step_estimator(
        "basis", {"calibration": "previous"}, prompt_ids=ids, ref_rewards=cache
    )
    load_estimator_state(step, {"basis_previous_index": 3})
    assert step.previous_index == 3
    with pytest.raises(InputError, match="not an index of its beta grid"):
        load_estimator_state(step, {"basis_previous_index": len(step.table.betas)})
    grpo = make_step_estimator("grpo")
    with pytest.raises(InputError, match="not an index of its beta grid"):
        load_estimator_state(grpo, {"basis_previous_index": 0})


@pytest.mark.parametrize("size", ["16k", "64k"])  # full in safetensors / in torch.save
def test_a_disk_full_checkpoint_is_a_write_error_and_leaves_no_partial(tmp_path, size):
    """Issue 35: a full disk while a checkpoint was saved raised torch's RuntimeError
    ('unexpected pos') or a SafetensorError, a traceback, and left the .partial folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from basis_bench.train.checkpoint import save_checkpoint

    class Tokenizer:
        def save_pretrained(self, folder):
            (Path(folder) / "tokenizer.json").write_text("{}")

    config = LlamaConfig(
        vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters())
    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, f"size={size}") as mounted:
        if not mounted:
            pytest.skip("cannot mount a small tmpfs here")
        blob = {"blob": torch.zeros(100_000)}  # too big for the 64k disk once the model fits
        with pytest.raises(OSError) as err:
            save_checkpoint(disk / "step-000001", model, Tokenizer(), optimizer, 1, blob)
        assert err.value.errno == errno.ENOSPC  # the CLI's one line, exit 1
        assert list(disk.iterdir()) == []


def test_resume_cannot_move_the_run_elsewhere(monkeypatch, capsys, tmp_path):
    """Seen on a GPU: `--resume RUN/checkpoints/step-T --set run_dir=OTHER` loaded the model,
    then failed on OTHER's missing log. It is refused before anything loads."""
    import torch

    import basis_bench.train.setup as setup
    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    state = {"step": 2, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    torch.save({**state, "config": vars(make_config({}))}, ckpt / TRAINER_STATE)
    result = run_main(
        monkeypatch, capsys, "train", "--resume", str(ckpt), "--set", f'run_dir="{tmp_path / "b"}"'
    )
    assert_one_line_error(result, "--set run_dir cannot move it", str(tmp_path / "run"))
    assert not (tmp_path / "b").exists()


def test_a_checkpoints_corrupt_model_file_is_named(tmp_path):
    from transformers import LlamaConfig

    from basis_bench.rollouts.models import load_model, resolve_checkpoint

    ckpt = tmp_path / "step-000001"
    LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    ).save_pretrained(ckpt)  # fmt: skip
    for data in (b"garbage", b"\xff" * 8 + b"{}"):
        (ckpt / "model.safetensors").write_bytes(data)
        with pytest.raises(InputError, match=r"step-000001: cannot load the model .*corrupt"):
            load_model(resolve_checkpoint(ckpt), "cpu")


def test_a_log_line_cut_by_a_crash_is_dropped(tmp_path):
    from basis_bench.train import read_log

    (tmp_path / "log.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"st')
    assert [r["step"] for r in read_log(tmp_path)] == [0, 1]
    (tmp_path / "log.jsonl").write_text('{"step": 0}\nnot json\n')
    with pytest.raises(InputError, match=r"log\.jsonl:2: not a JSON record"):
        read_log(tmp_path)


@pytest.mark.parametrize(
    ("config", "log", "needle"),
    [
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"}, b"\xff\xfe\n",
         "log.jsonl:1: not UTF-8 text"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": 1, "mean_reward": 0.5}\n[1, 2]\n', "log.jsonl:2: not a JSON record (a list)"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": 1, "mean_reward": "high"}\n', "'mean_reward' is 'high', not a number"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": "x", "mean_reward": 0.5}\n', "'step' is 'x', not a number"),
        (None, b'{"step": 1, "mean_reward": 0.5}\n', "config.json: not a JSON configuration"),
        ({"estimator": "basis"}, b'{"step": 1, "mean_reward": 0.5}\n',
         "'group_size' is missing or not a int"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": 100000000000000000000, "mean_reward": 0.5}\n',
         "'step' is 100000000000000000000, not a step number"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": -1, "mean_reward": 0.5}\n', "'step' is -1, not a step number"),
    ],
)  # fmt: skip
def test_train_figures_refuses_a_broken_run_in_one_line(
    monkeypatch, capsys, tmp_path, config, log, needle
):
    """Each once a traceback (UnicodeDecodeError, AttributeError, a polars builder error,
    TypeError, KeyError); nothing is written."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config))
    (run / "log.jsonl").write_bytes(log)
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(run), "--out", str(out))
    assert_one_line_error(result, needle)
    assert not out.exists()


def test_train_figures_refuses_a_run_given_twice_and_train_a_setting_set_twice(
    monkeypatch, capsys, tmp_path
):
    """The run's curves were drawn twice under two labels; the later --set silently won."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"estimator": "basis", "group_size": 8, "loss": "gpg"})
    )
    (run / "log.jsonl").write_text('{"step": 1, "mean_reward": 0.5}\n')
    out = tmp_path / "figs"
    args = ["train-figures", str(run), str(tmp_path / "." / "run"), "--out", str(out)]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "run", "is given twice")
    assert not out.exists()
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{tmp_path / "train"}"\n')
    args = ["train", "--config", str(config), "--set", "lr=1e-5", "--set", "lr=2e-5"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "--set lr is given twice")
    assert not (tmp_path / "train").exists()


# --------------------------------------------------------------------------- the messages


def test_interrupt_and_failure_messages_say_what_each_command_keeps():
    assert "rerun the same command to resume" in after_failure(["bb", "oracle", "--out", "x"])
    assert "--resume" in after_failure(["bb", "train", "--config", "c.toml"])
    assert "resume" not in after_failure(["bb", "import", "counts", "a.csv"])
    assert "rewrite" in after_failure(["bb", "simulate", "--out", "x"])
    assert "resume" not in after_failure(["bb", "evaluate"])


def test_ctrl_c_in_train_does_not_promise_an_oracle_resume(monkeypatch, capsys, tmp_path):
    import basis_bench.train as train_pkg

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_pkg, "train", interrupted)
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{tmp_path / "run"}"\n')
    code, message, _ = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert code == 130 and "--resume RUN/checkpoints/step-T" in message
    assert "completed parts" not in message


# --------------------------------------------------------------------------- the store


def test_null_policies_are_refused_with_their_count(tmp_path):
    out = tmp_path / "ds"
    frame = pl.DataFrame(
        {
            "prompt_id": ["a", "a", "b", "b"],
            "policy": ["p", None, None, "p"],
            "sample_idx": [0, 1, 0, 1],
            "reward": [1.0, 0.0, 1.0, 0.0],
        },
        schema_overrides={"sample_idx": pl.Int32},
    )
    write_parquet_atomic(frame, out / "rollouts.parquet")
    for policies in (None, ["p"]):
        with pytest.raises(InputError, match=r"2 row\(s\) with a null or non-String 'policy'"):
            load_rollouts(out, policies)


def test_atomic_write_keeps_the_usual_file_mode(tmp_path):
    mask = os.umask(0o022)
    os.umask(mask)
    with atomic_write(tmp_path / "f.txt") as tmp:
        tmp.write_text("x")
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~mask


def test_reward_config_refuses_non_finite_timeouts():
    from basis_bench.rollouts.rewards import RewardConfig

    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(InputError, match=r"timeout_s must be (a number, not NaN|finite|> 0)"):
            RewardConfig(timeout_s=bad)


WRITER = """
import sys, numpy as np, polars as pl
from basis_bench.outputs import write_parquet_atomic
me, path = int(sys.argv[1]), sys.argv[2]
for i in range(30):
    n = 2000 + 997 * ((i * 7 + me) % 11)  # files of different sizes
    write_parquet_atomic(pl.DataFrame({"writer": np.full(n, me), "n": np.full(n, n)}), path)
"""


def test_two_writers_and_a_reader_never_see_a_torn_file(tmp_path):
    """Two processes x 30 writes of one path while this process reads it: both writers
    finish, every read is one whole file (its rows all from one write), and no
    temporary file is left behind.

    The reader opens the path once per read. Readers that open a path twice in one read
    (``pq.read_table(path)``, ``pl.read_parquet(path)``) can pair one version's footer with
    another's pages while a writer replaces the file; that is the reader mixing two whole
    files, not a torn file, and the store reads replaceable files through one handle."""
    path = tmp_path / "shared.parquet"
    write_parquet_atomic(pl.DataFrame({"writer": [9], "n": [1]}), path)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(me), str(path)], env=env)
        for me in (0, 1)
    ]
    reads = 0
    while any(w.poll() is None for w in writers):
        with open(path, "rb") as fh:  # one open: one version of the file
            table = pq.read_table(io.BytesIO(fh.read())).to_pydict()  # raises if torn
        assert len(set(table["writer"])) == 1 and set(table["n"]) == {len(table["n"])}
        reads += 1
        time.sleep(0.001)
    assert [w.wait() for w in writers] == [0, 0]
    assert reads > 0
    assert [f.name for f in tmp_path.iterdir()] == ["shared.parquet"]


# --------------------------------------------------------------------------- value benchmark
# (issue 14, part 2: simulate, evaluate, sensitivity, figures and the estimators' boundary)

EVAL = ["--repeats", "3", "--oracle-n", "2", "--ref-n", "4", "--batch-size", "4"]
EVAL_GROUP = [*EVAL, "--group-size", "2"]


def evaluate_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["evaluate", "--rollouts", str(data), "--out", str(out), *EVAL_GROUP, *extra]


def siblings(path: Path) -> list[str]:
    """Hidden staging or swapped-out folders an evaluate run left beside ``path``."""
    return [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]


def test_simulate_force_writes_over_a_real_dataset(monkeypatch, capsys, real_dataset):
    before = snapshot(real_dataset)
    refused = run_main(monkeypatch, capsys, "simulate", "--out", str(real_dataset), *SMALL_SIM)
    assert_one_line_error(refused, "real rollouts", "--force")
    assert snapshot(real_dataset) == before
    args = ["simulate", "--out", str(real_dataset), *SMALL_SIM, "--force"]
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert read_output_marker(real_dataset)["simulated"] == "mixed"


def test_evaluate_refuses_out_inside_rollouts_and_other_kinds(
    monkeypatch, capsys, sim_dataset, real_dataset, tmp_path
):
    before = snapshot(sim_dataset)
    for out in (sim_dataset / "results", sim_dataset):
        result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))
        assert_one_line_error(result, "inside the rollouts dataset")
    assert snapshot(sim_dataset) == before
    real = snapshot(real_dataset)
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, real_dataset))
    assert_one_line_error(result, "already holds a rollouts dataset", "choose a new or empty")
    assert "--force" not in result.message  # evaluate has none
    assert snapshot(real_dataset) == real
    (tmp_path / "file").write_text("keep")
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "file"))
    assert_one_line_error(result, "is a file")
    assert (tmp_path / "file").read_text() == "keep"


def test_evaluate_with_only_a_stateful_estimator_reports_its_trajectory(sim_dataset, tmp_path):
    """basis_memory has no one-step rows: the run still succeeds (it used to crash on the empty
    summary table), trajectory.csv holds its numbers and the console prints them."""
    from typer.testing import CliRunner

    from basis_bench.cli import app

    out = tmp_path / "res"
    args = evaluate_args(sim_dataset, out, "--estimators", "basis_memory", "--no-estimates")
    result = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    traj = pl.read_csv(out / "trajectory.csv")
    assert traj["estimator"].unique().to_list() == ["basis_memory"]
    # ... and the console shows them: one row per estimator, one column per checkpoint
    mse = traj.filter(pl.col("scope") == "checkpoint")["mse_noise_corrected"].to_list()
    row = next(line for line in result.output.splitlines() if "basis_memory" in line)
    assert row.split()[2:-1] == [f"{v:.5f}" for v in mse]


def test_a_rerun_replaces_the_whole_run(monkeypatch, capsys, sim_dataset, tmp_path):
    out = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0
    assert (out / "g_sweep.csv").exists()
    args = evaluate_args(sim_dataset, out, "--estimators", "basis", "--no-estimates")
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert not (out / "g_sweep.csv").exists()
    assert not (out / "estimates.parquet").exists()
    run = json.loads((out / "run.json").read_text())
    files = {f.name for f in out.iterdir()} - {OUTPUT_MARKER, LOCK_FILE, "run.json"}
    assert set(run["tables"]) == files
    assert pl.read_csv(out / "summary.csv")["estimator"].unique().to_list() == ["basis"]
    assert siblings(out) == []


def test_a_failed_run_keeps_the_earlier_run_whole(monkeypatch, capsys, sim_dataset, tmp_path):
    import basis_bench.evaluation.run as run_module

    out = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0
    before = snapshot(out)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "summary.csv"))

    monkeypatch.setattr(run_module, "_trajectory", full)  # after every per-batch table
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out, "--seed", "1"))
    assert_one_line_error(result, "no space left", "earlier run whole", code=1)
    assert snapshot(out) == before
    assert siblings(out) == []


def test_a_read_only_parent_is_one_line(monkeypatch, capsys, sim_dataset, tmp_path):
    import basis_bench.evaluation.tables as tables_module

    def read_only(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(tmp_path))

    monkeypatch.setattr(tables_module.tempfile, "mkdtemp", read_only)
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "res"))
    assert_one_line_error(result, "read-only file system", code=1)


def test_figures_refuse_a_table_of_another_run(monkeypatch, capsys, sim_dataset, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, old))[0] == 0
    args = evaluate_args(sim_dataset, new, "--estimators", "basis,reinforce_pp")
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    shutil.copy2(old / "g_sweep.csv", new / "g_sweep.csv")  # what a pre-fix rerun left
    before = snapshot(new)
    result = run_main(
        monkeypatch, capsys, "figures", "--results", str(new), "--out", str(tmp_path / "f")
    )
    assert_one_line_error(result, "g_sweep.csv", "not part of the run")
    assert snapshot(new) == before
    assert not (tmp_path / "f").exists()


def test_figures_refuse_a_record_whose_tables_are_no_map(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """A hand-edited "tables": 5 was a TypeError traceback."""
    res = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, res))[0] == 0
    record = json.loads((res / "run.json").read_text())
    (res / "run.json").write_text(json.dumps({**record, "tables": 5}))
    figures = ["figures", "--results", str(res), "--out", str(tmp_path / "f")]
    result = run_main(monkeypatch, capsys, *figures)
    assert_one_line_error(result, "run.json is not a readable run record", "'tables' is a int")


def test_evaluate_then_figures_with_their_defaults_run_in_a_clone(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """figures' default --out was 'figures', which in a clone holds the committed
    figures/default and figures/training: the default flow was refused."""
    monkeypatch.chdir(tmp_path)
    committed = tmp_path / "figures" / "default"
    claim_output_dir(committed, "figures")
    (committed / "fig3a_mse.png").write_bytes(b"committed")
    results = Path("results/value-estimation")
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results)).code == 0
    assert run_main(monkeypatch, capsys, "figures").code == 0
    assert (tmp_path / "figures" / "value-estimation" / "fig3a_mse.png").is_file()
    assert (committed / "fig3a_mse.png").read_bytes() == b"committed"


@pytest.fixture(scope="module")
def legacy_results(tmp_path_factory) -> Path:
    """A results folder whose run.json predates run ids (no table checksums)."""
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.run import evaluate

    data = simulate(
        SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6),
        tmp_path_factory.mktemp("d"),
    )
    out = tmp_path_factory.mktemp("r") / "res"
    cfg = EvaluateConfig(
        rollouts=str(data), repeats=3, oracle_n=2, ref_n=4, batch_size=4, group_size=2
    )
    evaluate(cfg, out)
    run = json.loads((out / "run.json").read_text())
    del run["tables"], run["run_id"]
    (out / "run.json").write_text(json.dumps(run))
    return out


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("truncated", "empty fields"),
        ("header-only", "no rows"),
        ("empty", "not a readable table"),
        ("renamed", "lacks the column(s) mse"),
        ("garbage", "not a readable table"),
    ],
)
def test_figures_refuse_a_broken_summary(
    monkeypatch, capsys, legacy_results, tmp_path, damage, needle
):
    results = tmp_path / "res"
    shutil.copytree(legacy_results, results)
    text = (legacy_results / "summary.csv").read_bytes()
    broken = {
        "truncated": text[: len(text) // 2],
        "header-only": text.splitlines(keepends=True)[0],
        "empty": b"",
        "renamed": text.replace(b",mse,", b",msx,", 1),
        "garbage": bytes(range(256)) * 8,
    }[damage]
    (results / "summary.csv").write_bytes(broken)
    before = snapshot(results)
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "figures", "--results", str(results), "--out", str(out))
    assert_one_line_error(result, "summary.csv", needle)
    assert snapshot(results) == before
    assert not out.exists()
    # with run ids, a table cut short is caught by its checksum too
    (results / "run.json").unlink()
    result = run_main(monkeypatch, capsys, "figures", "--results", str(results), "--out", str(out))
    assert_one_line_error(result, "no run.json")


def test_figures_out_a_file_or_a_results_folder(monkeypatch, capsys, legacy_results, tmp_path):
    (tmp_path / "file").write_text("keep")
    args = ["figures", "--results", str(legacy_results), "--out"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args, str(tmp_path / "file")), "is a file")
    before = snapshot(legacy_results)
    result = run_main(monkeypatch, capsys, *args, str(legacy_results))
    assert_one_line_error(result, "already holds a results folder")
    assert snapshot(legacy_results) == before


@pytest.mark.parametrize("command", ["evaluate", "sensitivity", "figures"])
@pytest.mark.parametrize("given", ["file", "missing"])
def test_a_file_or_a_missing_path_as_input_folder_says_which(
    monkeypatch, capsys, tmp_path, command, given
):
    """``--rollouts FILE`` once said "does not exist", and figures advised running evaluate
    into the file: the message says what the path is, and nothing is written."""
    source = tmp_path / "rollouts.parquet"
    if given == "file":
        source.write_text("mine")
    option = "--results" if command == "figures" else "--rollouts"
    out = tmp_path / "out"
    result = run_main(monkeypatch, capsys, command, option, str(source), "--out", str(out))
    needle = "is a file, not a" if given == "file" else "does not exist"
    assert_one_line_error(result, str(source), needle)
    assert not out.exists()
    assert given == "missing" or source.read_text() == "mine"


def test_estimator_lists(sim_dataset, tmp_path):
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.run import evaluate

    cfg = EvaluateConfig(
        rollouts=str(sim_dataset), repeats=3, oracle_n=2, ref_n=4, batch_size=4, group_size=2
    )
    only = evaluate(
        EvaluateConfig(**{**cfg.__dict__, "estimators": ("spo_tracker",)}), tmp_path / "a"
    )
    assert only.trajectory is not None and only.summary.is_empty()
    assert set(only.trajectory["estimator"]) == {"spo_tracker"}
    both = evaluate(
        EvaluateConfig(**{**cfg.__dict__, "estimators": ("all", "basis")}), tmp_path / "b"
    )
    assert not both.summary.select("checkpoint", "estimator").is_duplicated().any()
    assert "basis" in set(both.summary["estimator"])


@pytest.mark.parametrize("eps", ["nan", "-1"])
def test_eps_is_checked_through_the_cli(monkeypatch, capsys, sim_dataset, tmp_path, eps):
    result = run_main(
        monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "r"), "--eps", eps
    )
    assert_one_line_error(result, "eps")
    assert not (tmp_path / "r").exists()
    args = [
        "sensitivity",
        "--rollouts",
        str(sim_dataset),
        "--out",
        str(tmp_path / "s"),
        "--eps",
        eps,
    ]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "eps")
    assert not (tmp_path / "s").exists()


def test_sensitivity_repeats_zero_is_one_line(monkeypatch, capsys, sim_dataset, tmp_path):
    args = ["sensitivity", "--rollouts", str(sim_dataset), "--out", str(tmp_path / "s")]
    assert_one_line_error(run_main(monkeypatch, capsys, *args, "--repeats", "0"), "--repeats")
    assert not (tmp_path / "s").exists()


def test_sensitivity_batch_larger_than_the_prompts_is_one_line(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """Every point of the sweep would be skipped: once an empty-concat traceback."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--out", str(out)]
    assert run_main(monkeypatch, capsys, *args).code == 0
    before = snapshot(out)
    result = run_main(monkeypatch, capsys, *args, "--batch-size", "4000000000")
    assert_one_line_error(result, "--batch-size 4000000000 exceeds the 12 prompts")
    assert snapshot(out) == before


def test_sensitivity_without_a_point_to_sweep_is_one_line(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """An empty --parameters, or one whose every value is beyond the data (ref_n above the 4
    cached samples, B above the 12 prompts), was polars' "cannot concat empty list"
    traceback; a parameter named twice wrote its rows twice."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--out", str(out)]
    for parameters, needle in [
        ("", "--parameters names none"),
        (" , ", "--parameters names none"),
        ("ref_n", "no value of --parameters ref_n fits this dataset"),
        ("ref_n,batch_size", "its 4 cached reference samples, batch_size at most its 12 prompts"),
    ]:
        result = run_main(monkeypatch, capsys, *args, "--parameters", parameters)
        assert_one_line_error(result, needle)
        assert not out.exists()
    assert run_main(monkeypatch, capsys, *args, "--parameters", "grid_size,grid_size").code == 0
    table = pl.read_csv(out / "sensitivity.csv")
    assert table.height == len(table.unique()) == 4 * table["checkpoint"].n_unique()


def test_sensitivity_refuses_a_fixed_beta_off_a_swept_grid_before_the_sweep(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """40.0125 is on --grid-size 32's grid, not on the 8-beta grid of the grid_size sweep:
    the sweep stopped there, blaming --grid-size."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--out", str(out)]
    args += ["--calibration", "fixed", "--fixed-beta", "40.0125"]
    result = run_main(monkeypatch, capsys, *args, "--parameters", "eps,grid_size")
    assert_one_line_error(result, "not on the 8-beta grid that --parameters grid_size sweeps")
    assert not out.exists()
    assert run_main(monkeypatch, capsys, *args, "--parameters", "eps").code == 0


def test_sensitivity_says_which_prompts_it_dropped(monkeypatch, capsys, sim_dataset, tmp_path):
    """Prompts without reference samples were dropped silently (evaluate says so)."""
    path = sim_dataset / "rollouts" / "reference.parquet"
    table = pq.read_table(path)
    kept = pl.from_arrow(table).filter(pl.col("prompt_id").is_in(["sim-00", "sim-01"]).not_())
    pq.write_table(kept.to_arrow().replace_schema_metadata(table.schema.metadata), path)
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--parameters", "eps"]
    result = run_main(monkeypatch, capsys, *args, "--out", str(tmp_path / "s"))
    assert result.code == 0
    assert "checkpoint late: dropped 2 prompt(s) missing from the reference cache" in result.out


def test_sensitivity_refuses_estimators_it_cannot_sweep(monkeypatch, capsys, sim_dataset, tmp_path):
    """--estimators all swept basis alone, spo_tracker was a traceback (beside basis it was
    dropped), and james_stein was told to "drop grpo/rloo"."""
    out = tmp_path / "s"
    args = ["sensitivity", "--rollouts", str(sim_dataset), *EVAL, "--parameters", "eps"]
    for names, needle in [
        ("all", "not 'all'"),
        ("basis,all", "not 'all'"),
        ("spo_tracker", "drop spo_tracker from --estimators"),
        ("basis,spo_tracker", "drop spo_tracker from --estimators"),
        ("basis,james_stein", "drop james_stein from --estimators"),
        ("basis_memory", "drop basis_memory from --estimators"),
    ]:
        result = run_main(monkeypatch, capsys, *args, "--estimators", names, "--out", str(out))
        assert_one_line_error(result, needle)
        assert not out.exists()


def test_a_comma_separated_checkpoint_list_is_told_to_repeat_the_option(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    args = ["evaluate", "--rollouts", str(sim_dataset), *EVAL_GROUP, "--out", str(tmp_path / "r")]
    result = run_main(monkeypatch, capsys, *args, "--checkpoint", "early, late")
    assert_one_line_error(
        result, "unknown checkpoint(s) 'early, late'", "--checkpoint early --checkpoint late"
    )


def test_a_dataset_link_to_nothing_is_named(monkeypatch, capsys, sim_dataset, tmp_path):
    """A dangling x.parquet link was 'a folder in the path does not exist (removed while the
    command ran?)', exit 1."""
    ghost = sim_dataset / "rollouts" / "ghost.parquet"
    ghost.symlink_to(tmp_path / "gone.parquet")
    args = ["evaluate", "--rollouts", str(sim_dataset), *EVAL_GROUP, "--out", str(tmp_path / "r")]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, f"{ghost} is a symbolic link to nothing")
    assert not (tmp_path / "r").exists()


def test_the_inner_rollouts_folder_given_for_the_dataset_is_refused(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """--rollouts DATASET/rollouts ran without the prompts table, and --out DATASET/res then
    wrote a results folder inside the dataset, breaking it for every later command."""
    before = snapshot(sim_dataset)
    inner = sim_dataset / "rollouts"
    for command, extra in [("evaluate", ["--group-size", "2"]), ("sensitivity", [])]:
        args = [command, "--rollouts", str(inner), *EVAL, *extra, "--out", str(sim_dataset / "res")]
        result = run_main(monkeypatch, capsys, *args)
        assert_one_line_error(result, "is the rollouts/ folder of the dataset", str(sim_dataset))
        assert snapshot(sim_dataset) == before


def test_figures_know_one_dataset_by_any_spelling_of_its_path(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """evaluate on --rollouts sim and sensitivity on its absolute path (or a link to it)
    recorded two strings, so figures skipped Fig. 5 as computed on another dataset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(sim_dataset)
    res = tmp_path / "res"
    evaluate = ["evaluate", "--rollouts", "sim", *EVAL_GROUP, "--no-trajectory"]
    assert run_main(monkeypatch, capsys, *evaluate, "--out", "res").code == 0
    for spelling in (f"{sim_dataset}/", "link"):
        sensitivity = ["sensitivity", "--rollouts", spelling, *EVAL, "--parameters", "eps"]
        assert run_main(monkeypatch, capsys, *sensitivity, "--out", str(res)).code == 0
        _, skipped = make_figures(res, tmp_path / "figs")
        assert "fig5_sensitivity" not in skipped, skipped
    run = json.loads((res / "run.json").read_text())
    assert run["rollouts"] == run["config"]["rollouts"] == str(sim_dataset.resolve())
    other = simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), tmp_path / "o")
    sensitivity = ["sensitivity", "--rollouts", str(other), *EVAL, "--parameters", "eps"]
    assert run_main(monkeypatch, capsys, *sensitivity, "--out", str(res)).code == 0
    _, skipped = make_figures(res, tmp_path / "figs")
    assert "sensitivity.csv was computed on" in skipped["fig5_sensitivity"]


def test_simulate_refuses_sizes_that_cannot_fit_before_writing(monkeypatch, capsys, tmp_path):
    earlier = tmp_path / "earlier"
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), earlier)
    before = snapshot(earlier)
    for out in (tmp_path / "new", earlier):
        for extra, needle in [
            (["--prompts", "1000000000"], "GiB of memory is free"),
            (["--checkpoint-n", "1000000000000"], "--checkpoint-n must be in [1, 2147483647]"),
            (["--ref-n", "3000000000"], "--ref-n must be in [1, 2147483647]"),
        ]:
            result = run_main(monkeypatch, capsys, "simulate", "--out", str(out), *extra)
            assert_one_line_error(result, needle)
    assert not (tmp_path / "new").exists()
    assert snapshot(earlier) == before


@pytest.mark.parametrize("command", ["evaluate", "sensitivity", "simulate"])
def test_a_negative_seed_is_one_line_and_writes_nothing(
    monkeypatch, capsys, sim_dataset, tmp_path, command
):
    new, earlier = tmp_path / "new", tmp_path / "earlier"
    if command == "simulate":
        args = ["simulate", *SMALL_SIM, "--out"]
        simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), earlier)
    else:
        options = EVAL_GROUP if command == "evaluate" else EVAL
        args = [command, "--rollouts", str(sim_dataset), *options, "--out"]
        assert run_main(monkeypatch, capsys, *args, str(earlier)).code == 0
    before = snapshot(earlier)
    for out in (new, earlier):
        result = run_main(monkeypatch, capsys, *args, str(out), "--seed", "-1")
        assert_one_line_error(result, "--seed must be >= 0; got -1")
    assert not new.exists()
    assert snapshot(earlier) == before


def test_rewards_outside_unit_interval_name_the_tracker_before_the_replay(
    monkeypatch, capsys, tmp_path
):
    import basis_bench.evaluation.run as run_module

    data = tmp_path / "wide"
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), data)
    for f in (data / "rollouts").glob("*.parquet"):
        table = pq.read_table(f)
        rewards = table["reward"].to_numpy() * 2
        pq.write_table(
            table.set_column(table.schema.get_field_index("reward"), "reward", [rewards]), f
        )

    def no_replay(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the replay started")

    monkeypatch.setattr(run_module, "_replay_all", no_replay)
    result = run_main(monkeypatch, capsys, *evaluate_args(data, tmp_path / "r"))
    assert_one_line_error(result, "outside [0, 1]", "spo_tracker", "--estimators vanilla,")
    assert "basis_memory" in result.message  # its Beta posterior needs [0, 1] too
    assert "spo_tracker" not in result.message.split("--estimators")[1]  # the list to keep had it
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("bad", ["garbage", "folder"])
def test_a_parquet_name_that_is_not_parquet(monkeypatch, capsys, sim_dataset, tmp_path, bad):
    path = sim_dataset / "rollouts" / "x.parquet"
    if bad == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"not parquet at all")
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, tmp_path / "r"))
    assert_one_line_error(
        result, "x.parquet", "folder" if bad == "folder" else "not a readable Parquet"
    )


@pytest.mark.parametrize(
    "rewards",
    ["int", "bool", "list", "bfloat16", "grad"],
)
def test_basis_accepts_ints_bools_lists_bfloat16_and_grad_tensors(rewards):
    import torch

    from basis_bench.estimators import Basis

    ids = ["a", "b", "c", "d"]
    cache = np.random.default_rng(0).integers(0, 2, size=(4, 16)).astype(float)
    basis = Basis(ids, cache)
    expected = np.asarray(basis(ids, np.array([1.0, 0.0, 0.0, 1.0])).baselines)
    given: Any = {
        "int": np.array([1, 0, 0, 1]),
        "bool": np.array([True, False, False, True]),
        "list": [1, 0, 0, 1],
        "bfloat16": torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.bfloat16),
        "grad": torch.tensor([1.0, 0.0, 0.0, 1.0], requires_grad=True),
    }[rewards]
    got = basis(ids, given).baselines
    values = got.detach().numpy() if hasattr(got, "detach") else np.asarray(got)
    assert np.allclose(values, expected, atol=1e-6)
    assert values.any()  # integer rewards gave all-zero baselines
    f32 = basis(ids, np.array([1, 0, 0, 1], dtype=np.float32)).baselines
    assert f32.dtype == np.float32  # floating dtypes keep theirs
    with pytest.raises(InputError, match="numbers"):
        basis(ids, ["a", "b", "c", "d"])


def test_leave_one_out_refuses_a_batch_of_one():
    from basis_bench.estimators import Basis, EstimatorInput, TiltTable, default_betas, get

    cache = np.ones((1, 8)) * 0.5
    with pytest.raises(InputError, match="at least 2 prompts"):
        Basis(["a"], cache)(["a"], np.array([1.0]))
    table = TiltTable.from_cache(cache, default_betas(8))
    v, var = table.gather(np.array([0]))
    batch = EstimatorInput(np.array([[1.0]]), v, var, table.betas)
    with pytest.raises(InputError, match="B=1"):
        get("basis")(batch)


def test_an_estimator_returning_the_wrong_shape_is_named():
    from basis_bench.estimators import ESTIMATORS, EstimatorInput, register_estimator, registry

    with registry.temporary():

        @register_estimator("wrong_shape_test")
        def _wrong(batch):
            return batch.rewards[..., 0]

        with pytest.raises(InputError, match="'wrong_shape_test' returned baselines of shape"):
            ESTIMATORS["wrong_shape_test"](EstimatorInput(np.ones((4, 1)) * 0.5))
    assert "wrong_shape_test" not in ESTIMATORS


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


@pytest.mark.parametrize("policy", ["ck\n", "p" * 201])
def test_a_policy_name_is_checked_whole_before_anything_is_written(
    monkeypatch, capsys, fake_ckpt, tmp_path, policy
):
    """``ck\\n`` passed the name check (``$`` matches before a final newline) and named a
    folder with a newline; 300 letters were a traceback (file name too long)."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\n")
    out = tmp_path / "out"
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(source), "--policy", policy, "--out", str(out)
    )
    assert_one_line_error(result, "--policy", "use 1-200 letters")
    args = oracle_args(fake_ckpt, out)
    args[args.index("--policy") + 1] = policy
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "--policy", "use 1-200 letters")
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["eval-jsonl", "counts"])
def test_import_refuses_a_source_given_twice(monkeypatch, capsys, real_dataset, tmp_path, fmt):
    """eval-jsonl read a file named twice as two seeds: every sample counted twice."""
    source = tmp_path / "s.jsonl"
    source.write_text(
        '{"idx":0,"score":[1,0]}\n'
        if fmt == "eval-jsonl"
        else '{"prompt_id":"a","n":4,"n_correct":1}\n'
    )
    before = snapshot(real_dataset)
    args = ["import", fmt, str(source), str(tmp_path / "." / "s.jsonl"), "--policy", "new"]
    result = run_main(monkeypatch, capsys, *args, "--out", str(real_dataset))
    assert_one_line_error(result, f"source '{tmp_path / '.' / 's.jsonl'}' is given twice")
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize("command", ["import", "simulate", "evaluate"])
def test_a_name_too_long_for_the_file_system_is_one_line(
    monkeypatch, capsys, sim_dataset, tmp_path, command
):
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\n")
    args = {
        "import": ["import", "counts", str(source), "--policy", "ck"],
        "simulate": ["simulate", *SMALL_SIM],
        "evaluate": ["evaluate", "--rollouts", str(sim_dataset), *EVAL_GROUP],
    }[command]
    out = tmp_path / ("x" * 300) / "out"  # once a traceback (file name too long)
    result = run_main(monkeypatch, capsys, *args, "--out", str(out))
    assert_one_line_error(result, "is 300 bytes long", "at most 255")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv", "sim"]


REPEATED_FIELDS = {  # (format, text whose line 2 names a field twice, the field)
    "eval-jsonl score": (
        "eval-jsonl",
        '{"idx":0,"score":[1]}\n{"idx":1,"score":[true],"score":[false]}\n',
        "score",
    ),
    "eval-jsonl gold answer": (
        "eval-jsonl", '{"idx":0,"score":[1]}\n{"idx":1,"gt":"4","score":[1],"gt":"5"}\n', "gt"
    ),
    "eval-jsonl escaped name": (
        "eval-jsonl", '{"idx":0,"score":[1]}\n{"idx":1,"score":[1],"sc\\u006fre":[0]}\n', "score"
    ),
    "eval-jsonl odd id": (
        "eval-jsonl", '{"idx":0,"score":[1]}\n{"idx":true,"score":[1],"score":[0]}\n', "score"
    ),
    "counts n": (
        "counts",
        '{"prompt_id":"a","n":4,"n_correct":1}\n{"prompt_id":"b","n":4,"n_correct":1,"n":8}\n',
        "n",
    ),
    "long reward": (
        "long",
        '{"prompt_id":"a","sample_idx":0,"reward":1}\n'
        '{"prompt_id":"b","sample_idx":0,"reward":1,"reward":0}\n',
        "reward",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REPEATED_FIELDS))
def test_import_refuses_a_field_named_twice_in_one_json_line(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """polars' reader kept the first of two equal keys (Python's json keeps the last): one
    of the line's values was silently dropped."""
    fmt, text, name = REPEATED_FIELDS[case]
    source = tmp_path / "s.jsonl"
    source.write_text(text)
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}:2: field {name!r} appears twice in the line" in message
    assert snapshot(real_dataset) == before


NOT_TEXT = {  # eval-jsonl line 2 holds a value polars made text, and what the error says
    "float answer": ("gt", 0.1 + 0.2, "'gt' is 0.30000000000000004, not text"),
    "boolean answer": ("gt", True, "'gt' is true, not text or an integer"),
    "float question": ("question", 7.5, "'question' is 7.5, not text"),
    "list answer": ("gt", ["5"], "'gt' is [\"5\"], not text"),
    "number response": ("code", ["a", 3], "'code' holds 3, not text"),
    "boolean response": ("code", [False, "b"], "'code' holds false, not text"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NOT_TEXT))
def test_eval_jsonl_refuses_texts_that_are_not_text(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """polars read a JSON 0.30000000000000004, true or 3 in a text field as the text it
    makes of it: a gold answer or response the evaluator never wrote."""
    name, value, needle = NOT_TEXT[case]
    fields = {"question": "q", "gt": "1", "code": ["a", "b"], "score": [1, 0]}
    lines = [{"idx": 0, **fields}, {"idx": 1, **fields, name: value}]
    source = tmp_path / "e.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)
    assert code == 2 and f"{source}:2: {needle}" in message, message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize("name", ["c.jsonl", "c.parquet"])
def test_counts_refuses_a_problem_or_answer_that_is_not_text(
    monkeypatch, capsys, real_dataset, tmp_path, name
):
    """The prompts of a counts import were cast to text: 0.1 + 0.2 became the answer
    "0.30000000000000004", true the answer "true". An integer answer stays its digits."""
    rows = {"prompt_id": ["a", "b"], "n": [4, 4], "n_correct": [1, 2], "problem": ["q", "r"]}
    source = tmp_path / name
    for answer, needle in ((0.1 + 0.2, "'answer' 0.30000000000000004"), (True, "'answer' true")):
        table = pl.DataFrame({**rows, "answer": [answer, answer]})
        if name.endswith(".jsonl"):
            table.write_ndjson(source)
        else:
            table.write_parquet(source)
        before = snapshot(real_dataset)
        code, message = import_into(monkeypatch, capsys, real_dataset, "counts", source)
        where = ":2" if name.endswith(".jsonl") else ": row 2"  # the last line shown
        assert code == 2 and f"{source}{where}: {needle} is not text or an integer" in message
        assert snapshot(real_dataset) == before
    new = {**rows, "prompt_id": ["c", "d"], "answer": [5, 6]}  # a, b hold other answers
    pl.DataFrame(new).write_parquet(source.with_suffix(".parquet"))
    args = ["counts", source.with_suffix(".parquet")]
    assert import_into(monkeypatch, capsys, real_dataset, *args)[0] == 0
    prompts = pl.read_parquet(real_dataset / "prompts.parquet")
    assert prompts.filter(pl.col("prompt_id") == "d")["answer"].to_list() == ["6"]


KEPT_COLUMNS = {  # (format, line 2 of a JSONL source, what the error says)
    "fractional tokens": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"n_tokens":3.7}', "'n_tokens' 3.7"
    ),
    "boolean tokens": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"n_tokens":true}', "'n_tokens' true"
    ),
    "number response": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"response":7}', "'response' 7"
    ),
    "number finish reason": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"finish_reason":5}',
        "'finish_reason' 5",
    ),
    "fractional level": (
        "counts", '{"prompt_id":"b","n":4,"n_correct":1,"problem":"q","answer":"1","level":2.5}',
        "'level' 2.5",
    ),
    "number subject": (
        "counts", '{"prompt_id":"b","n":4,"n_correct":1,"problem":"q","answer":"1","subject":3}',
        "'subject' 3",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(KEPT_COLUMNS))
def test_import_refuses_kept_columns_the_store_would_change(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """Optional columns were cast to the store's types: 3.7 tokens became 3, a response 7
    the text "7", a level 2.5 the level 2."""
    fmt, line, needle = KEPT_COLUMNS[case]
    first = {
        "long": '{"prompt_id":"a","sample_idx":0,"reward":1}',
        "counts": '{"prompt_id":"a","n":4,"n_correct":1,"problem":"q","answer":"2"}',
    }[fmt]
    source = tmp_path / "s.jsonl"
    source.write_text(f"{first}\n{line}\n")
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}:2: {needle} is not " in message, message
    assert snapshot(real_dataset) == before


def test_import_prompts_table_values_are_not_cast(monkeypatch, capsys, real_dataset, tmp_path):
    """``--prompts FILE`` was cast to the store's types: an answer 0.1 + 0.2 became the text
    "0.30000000000000004" (a level 2.5 the level 2: the same check as counts' own)."""
    counts = tmp_path / "c.csv"
    counts.write_text("prompt_id,n,n_correct\nc,4,1\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_id":"c","problem":"q","answer":0.30000000000000004,"level":2}\n')
    before = snapshot(real_dataset)
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(counts), "--policy", "new",
        "--out", str(real_dataset), "--prompts", str(prompts),
    )  # fmt: skip
    assert result[0] == 2 and f"{prompts}:1: 'answer' 0.30000000000000004 is not" in result[1]
    assert snapshot(real_dataset) == before


def test_eval_jsonl_keeps_responses_where_only_some_lines_have_them(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """A line without a responses list beside lines with one was a polars traceback (the
    lists to explode differed in length); its samples now have no response."""
    source = tmp_path / "e.jsonl"
    source.write_text('{"idx":0,"score":[1,0],"code":["a","b"]}\n{"idx":1,"score":[1]}\n')
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)[0] == 0
    rows = load_rollouts(real_dataset, ["new"]).sort("prompt_id", "sample_idx")
    assert rows["response"].to_list() == ["a", "b", None]


def test_acc_history_refuses_means_that_are_not_numbers(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """polars read a mean ``true`` as 1.0 and ``"0.5"`` as 0.5 (an id spelled "true" is
    fine)."""
    source = tmp_path / "h.json"
    for means, needle in (("[0.5, true]", "true"), ('["0.5"]', '"0.5"')):
        source.write_text(f'{{"true": [0.25], "b": {means}}}')
        before = snapshot(real_dataset)
        args = ("--rollouts-per-visit", "4")
        code, message = import_into(monkeypatch, capsys, real_dataset, "acc-history", source, *args)
        assert code == 2 and f"{source}: id 'b': mean reward {needle} is not a number" in message
        assert snapshot(real_dataset) == before


@pytest.mark.parametrize(
    ("fmt", "text", "flag", "column"),
    [
        ("long", "prompt_id,sample_idx,reward\na,0,1\n", "--policy-col", "who"),
        ("counts", "prompt_id,n,n_correct,problem\nc,4,1,q\n", "--problem-col", "question"),
        ("counts", "prompt_id,n,n_correct,problem\nc,4,1,q\n", "--answer-col", "gold"),
    ],
)
def test_import_refuses_a_named_column_the_source_lacks(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, text, flag, column
):
    """``--policy-col who`` on a table without it imported every row as the policy, and a
    misspelt ``--problem-col`` wrote no prompts: an option the user gave went unused."""
    source = tmp_path / "s.csv"
    source.write_text(text)
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, fmt, source, flag, column)
    assert code == 2 and f"missing column(s) {column!r} ({flag})" in message, message
    assert snapshot(real_dataset) == before


def test_eval_jsonl_without_questions_writes_no_empty_prompts(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """Lines without ``question`` made prompts with problem "" and answer "": into a dataset
    holding the prompt, the import was refused (answer "2" against ""); alone, it wrote empty
    problems."""
    source = tmp_path / "e.jsonl"
    source.write_text('{"idx":"a","score":[1,0]}\n')
    prompts = (real_dataset / "prompts.parquet").read_bytes()
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)[0] == 0
    assert (real_dataset / "prompts.parquet").read_bytes() == prompts
    out = tmp_path / "alone"
    args = ["import", "eval-jsonl", str(source), "--policy", "p", "--out", str(out)]
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert not (out / "prompts.parquet").exists()


def test_eval_jsonl_reads_an_integer_gold_answer_as_its_digits(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """Evaluators often log a numeric answer as a JSON integer: it is its digits exactly."""
    source = tmp_path / "e.jsonl"
    source.write_text('{"idx":0,"question":"1+4?","gt":5,"score":[1]}\n')
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)[0] == 0
    prompts = pl.read_parquet(real_dataset / "prompts.parquet")
    assert prompts.filter(pl.col("prompt_id") == "0")["answer"].to_list() == ["5"]


NUMBER_POLICIES = {  # (file name, content, where the policy 1 is refused)
    "jsonl integers": ("l.jsonl", '{"prompt_id":"a","policy":1,"sample_idx":0,"reward":1}\n', ":1"),
    "jsonl float beside text": (
        "l.jsonl",
        '{"prompt_id":"a","policy":"b","sample_idx":0,"reward":1}\n'
        '{"prompt_id":"a","policy":1.0,"sample_idx":0,"reward":1}\n',
        ":2",
    ),
    "jsonl integer beside text": (
        "l.jsonl",
        '{"prompt_id":"a","policy":1,"sample_idx":0,"reward":1}\n'
        '{"prompt_id":"a","policy":"1","sample_idx":1,"reward":1}\n',
        ":1",
    ),
    "parquet integers": ("l.parquet", None, ": row 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NUMBER_POLICIES))
def test_long_import_refuses_a_policy_column_that_is_not_text(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """``--policy 1`` matched the text polars makes of a JSON 1 or 1.0 (and a Parquet
    integer column): a number silently named a policy. Policy names are text."""
    name, text, where = NUMBER_POLICIES[case]
    source = tmp_path / name
    if text is None:
        pl.DataFrame(
            {"prompt_id": ["a"], "policy": [1], "sample_idx": [0], "reward": [1.0]}
        ).write_parquet(source)
    else:
        source.write_text(text)
    before = snapshot(real_dataset)
    args = ["import", "long", str(source), "--policy", "1", "--out", str(real_dataset)]
    code, message, _ = run_main(monkeypatch, capsys, *args)
    assert code == 2 and f"{source}{where}: 'policy' 1" in message, message
    assert "is not text: write it as text" in message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize("parts", [("x" * 300, "run"), ("run", "x" * 300)])
def test_a_train_run_dir_name_too_long_is_one_line(monkeypatch, capsys, tmp_path, parts):
    """A long name above the last one was exit 1 (the check for an earlier run's log met
    ENAMETOOLONG before the claim's check)."""
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{tmp_path.joinpath(*parts)}"\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert_one_line_error(result, "run_dir: the name xxxx", "is 300 bytes long", "at most 255")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]


def test_a_folder_removed_under_a_running_command_is_one_line(monkeypatch, capsys, tmp_path):
    import basis_bench.rollouts.simulate as simulate_module

    def removed(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(tmp_path / "gone"))

    monkeypatch.setattr(simulate_module, "write_parquet_atomic", removed)
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(tmp_path / "s"), *SMALL_SIM)
    assert_one_line_error(result, "does not exist (removed while the command ran?)", code=1)


def test_figures_refuse_a_table_that_is_a_folder(monkeypatch, capsys, sim_dataset, tmp_path):
    results = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results))[0] == 0
    (results / "g_sweep.csv").unlink()
    (results / "g_sweep.csv").mkdir()
    result = run_main(
        monkeypatch, capsys, "figures", "--results", str(results), "--out", str(tmp_path / "f")
    )
    assert_one_line_error(result, "g_sweep.csv is a folder, not a table")
    assert not (tmp_path / "f").exists()


def test_a_rollouts_link_to_nothing_says_so(monkeypatch, capsys, tmp_path):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for link in ("loop", "dangling"):
        args = evaluate_args(tmp_path / link, tmp_path / "out")
        assert_one_line_error(run_main(monkeypatch, capsys, *args), "a symbolic link to nothing")
    assert not (tmp_path / "out").exists()


def test_import_refuses_a_column_named_twice_in_a_csv_header(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """polars read the first ``n`` and renamed the second: the value 5 was silently dropped."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct,n\na,4,1,5\n")
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", source)
    assert code == 2 and f"{source}:1: column 'n' appears twice in the header" in message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--grid-size", "100000000"], "--grid-size must be in [1, 1024]"),  # once an OOM kill
        (["--option", "basis.eps=0.1", "--option", "basis.eps=0.2"], "basis.eps is given twice"),
    ],
)
def test_evaluate_refuses_a_grid_too_large_and_an_option_given_twice(
    monkeypatch, capsys, sim_dataset, tmp_path, extra, needle
):
    out = tmp_path / "res"
    assert_one_line_error(
        run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out, *extra)), needle
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "extra", "needle"),
    [
        (  # a misspelt field name went unused: no prompts written, exit 0
            '{"idx":"a","score":[1],"question":"1+1?","gt":"2"}\n',
            ["--problem-col", "quest"],
            "--problem-col 'quest': no line of",
        ),
        (
            '{"idx":"a","score":[1],"code":["2"]}\n',
            ["--response-field", "responses"],
            "--response-field 'responses': no line of",
        ),
        (  # line 2 would have written problem "" and answer "" for prompt b
            '{"idx":"a","score":[1],"question":"1+1?","gt":"2"}\n{"idx":"b","score":[0],"gt":"4"}\n',
            [],
            ":2: no 'question', which other lines have",
        ),
        (
            '{"idx":"a","score":[1],"question":"1+1?","gt":"2"}\n'
            '{"idx":"b","score":[0],"question":"2+2?"}\n',
            [],
            ":2: no 'gt', which other lines have",
        ),
    ],
)
def test_eval_jsonl_refuses_unused_field_names_and_partial_prompts(
    monkeypatch, capsys, real_dataset, tmp_path, text, extra, needle
):
    source = tmp_path / "e.jsonl"
    source.write_text(text)
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source, *extra)
    assert code == 2 and needle in message, message
    assert snapshot(real_dataset) == before
