"""Lock files (issue 45): a finished output folder keeps no ``.basis-bench.lock``, and
removing it never lets two writers into one folder.

The last process to let a folder's lock go removes the file while it still locks it whole;
a process that opened the file before then and locked it after finds the path gone or
naming another file, and locks that one instead. The race is run for real, in processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import evaluate_args, run_cli, run_main

from basis_bench.guards.locks import LOCK_FILE

ROOT = Path(__file__).resolve().parents[1]


def lock_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(LOCK_FILE))


def test_finished_simulate_evaluate_sensitivity_figures_leave_no_lock_file(
    monkeypatch, capsys, tmp_path
):
    """Each left an empty lock file in its folder, and a read left one in the dataset."""
    data, results = tmp_path / "sim", tmp_path / "results"
    commands = [
        ["simulate", "--out", str(data), "--prompts", "12", "--ref-n", "4"],
        evaluate_args(data, results),
        evaluate_args(data, results),  # a rerun swaps a new results folder in
        ["sensitivity", "--rollouts", str(data), "--out", str(results), "--repeats", "2",
         "--oracle-n", "2", "--ref-n", "4", "--batch-size", "4"],
        ["figures", "--results", str(results), "--out", str(tmp_path / "figures")],
    ]  # fmt: skip
    for args in commands:
        assert run_main(monkeypatch, capsys, *args).code == 0, args
        assert lock_files(tmp_path) == [], args
    assert (results / "summary.csv").is_file() and (tmp_path / "figures").is_dir()


def test_two_oracle_shards_at_once_leave_no_lock_file(tiny_model, tmp_path):
    """The shards hold the folder's lock shared; whichever lets go last removes the file."""
    out = tmp_path / "o"
    args = ["oracle", "--model", str(tiny_model), "--policy", "tiny", "--prompts",
            "arithmetic:n=4,digits=1,steps=1,seed=5", "--n", "2", "--max-new-tokens", "4",
            "--chunk-size", "1", "--device", "cpu", "--workers", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    shards = [
        subprocess.Popen(
            [sys.executable, "-m", "basis_bench", *args, "--shard", f"{i}/2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    for shard in shards:
        _, err = shard.communicate(timeout=300)
        assert shard.returncode == 0, err
    assert len(list((out / "rollouts" / "tiny").glob("*.parquet"))) == 4
    assert lock_files(out) == []
    assert run_cli([*args, "--shard", "0/2"]).returncode == 0  # a rerun: nothing to do
    assert lock_files(out) == []


WRITER = """
import os, sys, time
from pathlib import Path
from basis_bench.errors import InputError
from basis_bench.guards.outputs import holds_output_locks, lock_output

folder, go, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

@holds_output_locks
def write():
    lock_output(folder)
    # O_EXCL: a second writer inside the folder at the same time fails here
    os.close(os.open(folder / "inside", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    time.sleep(0.0005)
    os.unlink(folder / "inside")

while not go.exists():
    time.sleep(0.001)
wrote = refused = 0
while wrote < rounds:
    try:
        write()
        wrote += 1
    except InputError:
        refused += 1
print(wrote, refused)
"""


def test_writers_racing_on_one_folder_exclude_each_other(tmp_path):
    """Four processes claim one folder over and over, each removing the lock file when it
    lets go: never two inside at once (a naive removal lets in a process that opened the
    removed file, beside one that made the new file), and no lock file is left at the end."""
    folder, go = tmp_path / "out", tmp_path / "go"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), str(go), "150"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    time.sleep(1)
    go.touch()
    refusals = 0
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err  # FileExistsError: two writers were inside
        wrote, refused = map(int, out.split())
        assert wrote == 150
        refusals += refused
    assert refusals > 0, "the writers never met: the race was not run"
    assert sorted(p.name for p in folder.iterdir()) == []
