"""Files that are not what they are named (issue 44, class 3): the package's own small files
(a dataset's training.json, a results folder's run.json and sensitivity.json, an output
marker, a training run's log.jsonl and config.json, the hash cache) are read by one reader,
``folders.read_small``, which refuses anything but a regular file in one line: a FIFO was
read as absent (evaluate switched schedules, exit 0) or opened and waited on for good."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import assert_one_line_error, run_cli, run_main

from basis_bench.errors import InputError

DENSE = Path(__file__).resolve().parents[1] / "basis_bench" / "data" / "dense"


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for path in dst.rglob("*"):
        path.chmod(path.stat().st_mode | 0o200)
    dst.chmod(dst.stat().st_mode | 0o200)
    return dst


def test_a_training_record_fifo_is_refused_not_read_as_absent(tmp_path):
    """It was read as absent: evaluate replayed the dense data on the epoch schedule, exit 0."""
    data = _writable_copy(DENSE, tmp_path / "dense")
    (data / "training.json").unlink()
    os.mkfifo(data / "training.json")
    out = tmp_path / "out"
    result = run_cli(["evaluate", "--rollouts", str(data), "--out", str(out)], timeout=120)
    assert_one_line_error(result, "training.json is a FIFO, not a regular file")
    assert not out.exists()


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_the_reader_refuses_what_is_not_a_regular_file(tmp_path, kind):
    from basis_bench.guards.folders import read_small
    from basis_bench.rollouts.training_record import read_training_record

    path = tmp_path / "training.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(InputError, match="not a regular file"):
        read_training_record(tmp_path)
    assert read_small(tmp_path / "missing.json") is None
    (tmp_path / "big").write_bytes(b"x" * 11)
    with pytest.raises(InputError, match="larger than 10 bytes"):
        read_small(tmp_path / "big", 10)


def test_a_marker_fifo_is_refused_not_taken_for_no_marker(monkeypatch, capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".basis-bench-output.json")
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(out), "--prompts", "4")
    assert_one_line_error(result, ".basis-bench-output.json is a FIFO")
    assert sorted(p.name for p in out.iterdir()) == [".basis-bench-output.json"]


def test_a_results_record_fifo_is_refused(monkeypatch, capsys, tmp_path):
    """A run.json FIFO is one line, as is a sensitivity.json FIFO, which was taken for a
    table written before sensitivity kept records (left unchecked)."""
    from basis_bench.evaluation.record import sensitivity_mismatch

    results = tmp_path / "res"
    results.mkdir()
    (results / "summary.csv").write_text("estimator,mse\nx,1\n")
    (results / "sensitivity.csv").write_text("parameter,value\n")
    os.mkfifo(results / "run.json")
    args = ["figures", "--results", str(results), "--out", str(tmp_path / "f")]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, "run.json is a FIFO")
    assert not (tmp_path / "f").exists()
    os.mkfifo(results / "sensitivity.json")
    with pytest.raises(InputError, match=r"sensitivity\.json is a FIFO"):
        sensitivity_mismatch(results, None)  # type: ignore[arg-type]


def test_a_training_log_fifo_is_refused(monkeypatch, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"estimator": "grpo", "group_size": 4, "loss": "grpo"}')
    os.mkfifo(run / "log.jsonl")
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(run), "--out", str(out))
    assert_one_line_error(result, "log.jsonl is a FIFO")
    assert not out.exists()


def test_train_refuses_a_log_fifo_before_a_model_loads(monkeypatch, capsys, tmp_path):
    """Appending the first record to it would wait for a reader for good."""
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "log.jsonl")
    config = tmp_path / "c.toml"
    config.write_text(f'run_dir = "{run}"\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert_one_line_error(result, "log.jsonl is a FIFO")


def test_a_finished_seeds_config_fifo_or_garbage_is_one_line(tmp_path):
    from basis_bench.train.seeds import read_run_config

    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(InputError, match=r"config\.json is a FIFO"):
        read_run_config(tmp_path / "config.json")
    (tmp_path / "config.json").unlink()
    for text in ("[" * 100 + "]" * 100, "[1]", "not json"):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(InputError, match=r"config\.json"):
            read_run_config(tmp_path / "config.json")


def test_a_hash_cache_fifo_is_no_cache_not_a_wait(monkeypatch, tmp_path):
    from basis_bench.rollouts import fingerprint

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    (tmp_path / "basis-bench").mkdir()
    os.mkfifo(tmp_path / "basis-bench" / "sha256.json")
    assert fingerprint._load_cache() == {}


# --------------------------------------------------------------------------- found in round 4's check


def test_a_small_file_is_read_without_reserving_its_limit():
    """``fh.read(limit + 1)`` reserved the 1 GiB limit before reading a 200-byte run.json:
    evaluate on the dense data's epoch schedule under ``ulimit -v 4000000`` ran its replay
    and then ended in a MemoryError traceback writing run.json."""
    import resource
    import subprocess
    import sys

    code = (
        "import resource, tempfile, pathlib\n"
        "from basis_bench.guards.folders import read_small\n"
        "path = pathlib.Path(tempfile.mkdtemp()) / 'run.json'\n"
        "path.write_text('{}')\n"
        "used = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize:'))"
        ".split()[1]) * 1024\n"
        "room = used + (256 << 20)  # far less than the 1 GiB limit, far more than the file\n"
        "resource.setrlimit(resource.RLIMIT_AS, (room, resource.RLIM_INFINITY))\n"
        "print(read_small(path))\n"
    )
    assert resource.RLIMIT_AS is not None
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "b'{}'"


def test_a_link_to_nothing_is_refused_not_read_as_absent(tmp_path):
    """A training.json that is a symbolic link to a file that does not exist was read as
    absent: evaluate replayed the dense data on the epoch schedule, exit 0 (the same
    silent switch as a FIFO's)."""
    from basis_bench.guards.folders import read_small

    data = _writable_copy(DENSE, tmp_path / "dense")
    (data / "training.json").unlink()
    (data / "training.json").symlink_to(tmp_path / "moved-away.json")
    with pytest.raises(InputError, match=r"training.json is a link to .*moved-away.json"):
        read_small(data / "training.json")
    out = tmp_path / "out"
    result = run_cli(["evaluate", "--rollouts", str(data), "--out", str(out)], timeout=120)
    assert_one_line_error(result, "training.json is a link to", "which does not exist")
    assert not out.exists()
