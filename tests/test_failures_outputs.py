"""Outputs that never lie (issue 14), the rules every command shares: no command writes
into another's folder (``claim_output_dir``), one atomic writer, a store that refuses what
it cannot read, and a message after a failure that says what the command keeps.

The ``test_failures_*`` files hold each command's one-line errors (no traceback, no changed
byte of earlier data) for every failure a user can provoke; CLI cases run in this process
through ``basis_bench.cli.main`` (conftest's ``run_main``), and no case loads a real model.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import assert_one_line_error, run_main

from basis_bench.cli.app import after_failure
from basis_bench.errors import InputError
from basis_bench.guards.outputs import (
    OUTPUT_MARKER,
    atomic_write,
    claim_output_dir,
    read_output_marker,
    recognise_output,
    write_parquet_atomic,
)
from basis_bench.guards.provenance import provenance
from basis_bench.rollouts.simulate import SimulationConfig, simulate
from basis_bench.rollouts.store import load_rollouts

SIMULATED = Path(__file__).resolve().parents[1] / "data" / "simulated"


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


# --------------------------------------------------------------------------- the messages


def test_interrupt_and_failure_messages_say_what_each_command_keeps():
    assert "rerun the same command to resume" in after_failure(["bb", "oracle", "--out", "x"])
    assert "--resume" in after_failure(["bb", "train", "--config", "c.toml"])
    assert "resume" not in after_failure(["bb", "import", "counts", "a.csv"])
    assert "rewrite" in after_failure(["bb", "simulate", "--out", "x"])
    assert "resume" not in after_failure(["bb", "evaluate"])


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
from basis_bench.guards.outputs import write_parquet_atomic
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


def test_provenance_names_the_commit_of_the_clone_it_runs_from():
    """Moved into guards/, provenance looked for .git in basis_bench/ rather than the clone,
    and every run.json said git_commit None."""
    import basis_bench

    root = Path(basis_bench.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("the package does not run from a git clone here")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert provenance()["git_commit"].removesuffix("-dirty") == head
