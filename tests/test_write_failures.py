"""A write the machine refuses (a full disk, a read-only file system, ``ulimit -f``) is one
clear message naming the path, in the notebook API (:class:`WriteFailed`, still an OSError of
its errno) and on the command line (one ``error:`` line, exit 1) alike. Real file systems: a
small tmpfs where one can be mounted, and RLIMIT_FSIZE in a process of its own."""

from __future__ import annotations

import errno
import os
import resource
import subprocess
from pathlib import Path

import pytest
from conftest import CLI, ONE_THREAD, assert_one_line_error, evaluate_args, mounted_tmpfs, run_main

import basis_bench
from basis_bench.errors import WriteFailed

SETTINGS = {"repeats": 3, "oracle_n": 2, "ref_n": 4, "batch_size": 4, "group_size": 2}


def leave_free(disk: Path, free: int) -> None:
    """Fill ``disk`` but ``free`` bytes (one file, truncated back from full)."""
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"x" * (1 << 16))
                fh.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC
    os.truncate(filler, max(0, filler.stat().st_size - free))


@pytest.fixture
def nearly_full(tmp_path):
    """A 1 MiB tmpfs with 20 kB free: room for the claim (marker, lock file), not for the
    tables or the parts."""
    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, "size=1m") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here")
        leave_free(disk, 20_000)
        yield disk


def assert_names_a_path_under(err: WriteFailed, disk: Path, reason: str, code: int) -> None:
    assert err.errno == code and isinstance(err, OSError)
    assert str(err).startswith(f"{reason} ({disk}/"), str(err)
    assert "\n" not in str(err) and err.filename.startswith(f"{disk}/")


def test_api_full_disk_is_one_message_naming_the_file(sim_dataset, nearly_full):
    """evaluate(out=...) and simulate on a full disk: polars' OSError had no errno and
    named no file ("No space left on device (os error 28)"), arrow's named none either."""
    with pytest.raises(WriteFailed) as evaluated:
        basis_bench.evaluate(sim_dataset, "grpo", out=nearly_full / "ev", **SETTINGS)
    assert_names_a_path_under(evaluated.value, nearly_full, "no space left on the device", 28)
    with pytest.raises(WriteFailed) as simulated:
        basis_bench.simulate(nearly_full / "sim", n_prompts=200)
    assert_names_a_path_under(simulated.value, nearly_full, "no space left on the device", 28)
    assert sorted(p.name for p in nearly_full.iterdir()) == ["filler"]  # nothing left behind


def test_cli_full_disk_is_one_line_naming_the_file(sim_dataset, nearly_full, monkeypatch, capsys):
    """The command line's evaluate on a full disk was polars' traceback (its OSError has no
    errno, so the one-line handler let it through)."""
    out = nearly_full / "ev"
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))
    assert_one_line_error(result, f"no space left on the device ({nearly_full}/", code=1)
    assert "earlier run whole" in result.message


def test_api_read_only_file_system_is_one_message_naming_the_folder(tmp_path):
    disk = tmp_path / "ro"
    with mounted_tmpfs(disk, "ro,size=64k") as mounted:
        if not mounted:
            pytest.skip("cannot mount a read-only tmpfs here")
        with pytest.raises(WriteFailed) as refused:
            basis_bench.simulate(disk / "sim", n_prompts=20)
    assert_names_a_path_under(refused.value, disk, "read-only file system", errno.EROFS)


def test_train_log_on_a_full_disk_names_the_log(tmp_path):
    """A write to an open file (the training log's append) names no file of its own."""
    from basis_bench.train.loop import append_jsonl

    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, "size=64k") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here")
        leave_free(disk, 0)
        with pytest.raises(WriteFailed) as refused:
            append_jsonl(disk / "log.jsonl", {"step": 1, "text": "x" * 10_000})
    assert str(refused.value) == f"no space left on the device ({disk}/log.jsonl)"


def _file_size_limit(limit: int):
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def test_ulimit_f_is_one_line_naming_the_file_cli_and_api(tmp_path):
    """``ulimit -f`` (EFBIG) was not among the failed writes the command line names: a
    traceback. Python ignores SIGXFSZ, so the write fails with EFBIG."""
    limit = _file_size_limit(4096)
    cli = subprocess.run(
        [*CLI, "simulate", "--out", str(tmp_path / "cli"), "--prompts", "200"],
        capture_output=True, text=True, timeout=300, env=ONE_THREAD, preexec_fn=limit,
    )  # fmt: skip
    assert_one_line_error(
        cli, "file larger than this process may write (ulimit -f)", f"({tmp_path}/cli/", code=1
    )
    code = (
        "import basis_bench, sys\n"
        "from basis_bench.errors import WriteFailed\n"
        "try:\n"
        f"    basis_bench.simulate({str(tmp_path / 'api')!r}, n_prompts=200)\n"
        "except WriteFailed as err:\n"
        "    print(err.errno, err)\n"
    )
    api = subprocess.run(
        [CLI[0], "-c", code], capture_output=True, text=True, timeout=300, env=ONE_THREAD,
        preexec_fn=limit,
    )  # fmt: skip
    assert api.returncode == 0, api.stderr[-2000:]
    assert api.stdout.startswith(
        f"{errno.EFBIG} file larger than this process may write (ulimit -f) ({tmp_path}/api/"
    ), api.stdout
