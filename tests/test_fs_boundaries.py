"""Outputs that never lie, third round (issue 35): cleanups that know their leftovers exactly,
links that lead out of a dataset, unreadable folders, outputs inside other data, and reads
bounded before they start.

Each case checks the exit code, the one-line message and that no earlier byte changed.
Permission cases run in a subprocess without the root override (``setpriv`` drops
CAP_DAC_OVERRIDE and friends), since the sandbox runs as root.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_main
from test_failures import evaluate_args, siblings

import basis_bench
import basis_bench.evaluation.run as run_module
from basis_bench.outputs import LOCK_FILE
from basis_bench.rollouts.simulate import SimulationConfig, simulate

ROOT = Path(basis_bench.__file__).resolve().parents[1]  # subprocesses run the code under test
CLI = [sys.executable, "-m", "basis_bench"]


@pytest.fixture
def sim_dataset(tmp_path) -> Path:
    out = tmp_path / "sim"
    simulate(SimulationConfig(n_prompts=12, reference_n=4, checkpoint_n=6), out)
    return out


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, cwd=cwd)


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


# --------------------------------------------------------------------------- 1: exact cleanups


def test_a_run_into_out_leaves_the_staging_of_out_dot_number_alone(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """``evaluate --out res`` while ``evaluate --out res.N`` runs: res's cleanup took
    ``.res.N...staging`` for a leftover of a dead process N and deleted the other run's
    files, which then failed."""
    first = tmp_path / f"res.{dead_pid()}"
    second = tmp_path / "res"
    write_text = run_module.write_text_atomic

    def meanwhile(path, text):  # the first run's tables are staged; run.json comes last
        assert cli(*evaluate_args(sim_dataset, second)).returncode == 0
        return write_text(path, text)

    monkeypatch.setattr(run_module, "write_text_atomic", meanwhile)
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, first)).code == 0
    assert (first / "summary.csv").is_file() and (second / "summary.csv").is_file()
    assert siblings(first) == siblings(second) == []


def holding_lock(folder: Path) -> subprocess.Popen[str]:
    """Another live process holding ``folder``'s writer lock, as a run writing it does."""
    code = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0); print('held', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder / LOCK_FILE)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_leftover_is_known_by_its_free_lock_not_by_a_pid(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """A staging folder named with a live process's id but whose writer is gone is removed;
    one whose writer holds its lock stays, whatever number its name holds (a process id
    means nothing on another host sharing the folder)."""
    out = tmp_path / "res"
    gone = [tmp_path / f".res.{os.getpid()}abc.staging", tmp_path / ".res.def.old"]
    for folder in gone:
        folder.mkdir()
        (folder / "summary.csv").write_text("x")
    live = tmp_path / ".res.ghi.staging"
    live.mkdir()
    holder = holding_lock(live)
    try:
        assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out)).code == 0
        assert siblings(out) == [live.name]
    finally:
        holder.communicate("")


def test_a_gguf_conversion_never_removes_a_folder_named_with_its_pid(tmp_path):
    """The dequantized copy was staged in ``.NAME.PID.partial`` and that name removed first:
    another host's job sharing the cache, with the same process id, lost its copy."""
    from basis_bench.errors import InputError
    from basis_bench.outputs import file_sha256
    from basis_bench.rollouts.models import hf_format_directory, resolve_checkpoint

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not a gguf file")
    cache = tmp_path / "cache"
    other = cache / f".m-{file_sha256(gguf)[:16]}.{os.getpid()}.partial"
    other.mkdir(parents=True)
    (other / "config.json").write_text("{}")
    with pytest.raises(InputError):
        hf_format_directory(resolve_checkpoint(gguf), cache)
    assert (other / "config.json").is_file()
