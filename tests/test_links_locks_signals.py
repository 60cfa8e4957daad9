"""Outputs that never lie, second round (issue 22): links, locks, interrupts and signals.

Links are followed by every command; two writers of one folder are refused; an interrupted
``import --replace`` puts the old data back; SIGTERM cleans up like Ctrl-C; the installed
package data, a path through a file and the current folder are refused in one line. Each
case checks the exit code, the message and that no earlier byte changed.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_one_line_error, evaluate_args, run_main, siblings, snapshot

import basis_bench.rollouts.importers.publishing as publishing_module
from basis_bench.guards.locks import LOCK_FILE
from basis_bench.rollouts.store import default_dataset, load_rollouts
from basis_bench.train.loop import append_jsonl

CLI = [sys.executable, "-m", "basis_bench"]
ROOT = Path(__file__).resolve().parents[1]


def counts_file(tmp_path: Path, name: str, n_correct: int) -> Path:
    path = tmp_path / name
    path.write_text(f"prompt_id,n,n_correct\na,4,{n_correct}\nb,4,1\n")
    return path


def import_args(source: Path, out: Path, *extra: str) -> list[str]:
    return ["import", "counts", str(source), "--policy", "ck", "--out", str(out), *extra]


def without_lock(files: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in files.items() if not k.endswith(LOCK_FILE)}


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )


# --------------------------------------------------------------------------- every command


@pytest.mark.parametrize("command", ["evaluate", "import", "simulate"])
def test_a_path_through_a_file_is_one_line(monkeypatch, capsys, sim_dataset, tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    out = blocker / "sub"
    args = {
        "evaluate": evaluate_args(sim_dataset, out),
        "import": import_args(counts_file(tmp_path, "c.csv", 2), out),
        "simulate": ["simulate", "--out", str(out), "--prompts", "4"],
    }[command]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "is a file, not a folder")
    assert blocker.read_text() == "mine"


@pytest.mark.parametrize("command", ["import", "simulate"])
def test_the_installed_package_data_is_read_only(monkeypatch, capsys, tmp_path, command):
    shipped = default_dataset()
    before = snapshot(shipped)
    args = {
        "import": import_args(counts_file(tmp_path, "c.csv", 2), shipped, "--force"),
        "simulate": ["simulate", "--out", str(shipped / "x"), "--prompts", "4", "--force"],
    }[command]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "read-only")
    assert snapshot(shipped) == before


@pytest.mark.parametrize("command", ["evaluate", "sensitivity", "import", "simulate", "figures"])
def test_a_loop_of_links_is_one_line(monkeypatch, capsys, sim_dataset, tmp_path, command):
    """A link loop as --out (or above it) is refused before anything is written, not an
    ELOOP traceback."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    results = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results)).code == 0
    for out in (tmp_path / "loop1", tmp_path / "loop2" / "sub"):
        args = {
            "evaluate": evaluate_args(sim_dataset, out),
            "sensitivity": ["sensitivity", "--rollouts", str(sim_dataset), "--out", str(out)],
            "import": import_args(counts_file(tmp_path, "c.csv", 2), out),
            "simulate": ["simulate", "--out", str(out), "--prompts", "4"],
            "figures": ["figures", "--results", str(results), "--out", str(out)],
        }[command]
        assert_one_line_error(run_main(monkeypatch, capsys, *args), "loop of symbolic links")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv", "loop1", "loop2", "res", "sim"]


def armed(pid: int) -> bool:
    """Whether the process catches SIGTERM (its SigCgt mask): the entry point has run."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_ctrl_c_and_sigterm_at_any_moment_are_one_line(sim_dataset, tmp_path):
    """Early (the moment the entry point has armed the signals, before the command line's
    imports) or late (during the replay), an interrupt is one line; a SIGTERM exits 143
    and, like Ctrl-C, leaves no staging folder behind. (Before the entry point runs, Python
    itself is starting up: that window is the interpreter's, not the package's.)"""
    for sig, code in [(signal.SIGINT, 130), (signal.SIGTERM, 143)]:
        out = tmp_path / f"early-{code}"
        proc = spawn(*evaluate_args(sim_dataset, out))
        while proc.poll() is None and not armed(proc.pid):
            time.sleep(0.001)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == code, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert not out.exists()
    out = tmp_path / "late"
    proc = spawn(*evaluate_args(sim_dataset, out, "--repeats", "100000"))
    deadline = time.monotonic() + 120
    while not siblings(out) and time.monotonic() < deadline:  # the replay is writing its stage
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err.strip().splitlines()[-1].startswith("terminated:"), err
    assert siblings(out) == []


def test_a_ctrl_c_while_the_entry_point_arms_the_signals_is_one_line(monkeypatch, capsys):
    """The race the test above once lost in CI: SIGTERM armed, then a Ctrl-C landed inside
    ``signal.signal(SIGINT, ...)`` (its handler installed, Python still in the call) and
    escaped the entry point as a traceback. Here the Ctrl-C lands there every time."""
    from basis_bench import __main__ as entry

    def arm(signum: int, handler: Any) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # nothing is installed: pytest's handlers stay

    monkeypatch.setattr(entry.signal, "signal", arm)
    try:
        entry.main()
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C escaped the entry point as a traceback")
    assert code == 130
    assert (
        capsys.readouterr().err == "interrupted before the command started: nothing was written\n"
    )


READER = """
import hashlib, sys, time
from pathlib import Path
from basis_bench.guards.locks import publishing
root = Path(sys.argv[1])
def files():
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(root.rglob("*.parquet"))}
with publishing(root, reading=True):
    before = files()
    print("reading", flush=True)
    time.sleep(float(sys.argv[2]))
    print("unchanged" if files() == before else "changed", flush=True)
"""


def test_a_simulate_rerun_is_seen_whole_by_a_reader(monkeypatch, capsys, sim_dataset):
    """A rerun rewrote prompts.parquet and each policy's file one after another: an evaluate
    reading meanwhile could pair one simulation's prompts with another's rollouts. Now the
    files are staged and swapped in under the publish lock a reader holds while it reads."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(sim_dataset), "4"],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
    args = ["simulate", "--out", str(sim_dataset), "--prompts", "12", "--seed", "7"]
    assert run_main(monkeypatch, capsys, *args)[0] == 0  # waits for the reader
    assert reader.communicate(timeout=60)[0].strip() == "unchanged"
    assert not [f for f in sim_dataset.rglob(".*") if f.name.endswith(".staged")]
    assert load_rollouts(sim_dataset)["prompt_id"].n_unique() == 12


def _swallowing(sig: int, real: Any) -> Any:
    """``real``, first raising the handler's interrupt for ``sig`` and swallowing it: what a
    polars constructor fed from numpy did with the handler's exception."""
    from basis_bench.errors import raise_interrupt

    def swallowing(*args: Any, **kwargs: Any) -> Any:
        try:
            raise_interrupt(sig, None)
        except KeyboardInterrupt:
            pass
        return real(*args, **kwargs)

    return swallowing


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_a_library_swallowed_is_still_reported(
    monkeypatch, capsys, tmp_path, sig, code
):
    """A polars constructor fed from numpy swallowed the KeyboardInterrupt the handler raised
    inside it (7 of 10 signals into a 6-second simulate): the command ran on and exited 0
    as if never interrupted. It still runs to its end, but says so and exits 130 / 143."""
    import basis_bench.rollouts.simulate as simulate_module

    real = simulate_module.write_parquet_atomic
    monkeypatch.setattr(simulate_module, "write_parquet_atomic", _swallowing(sig, real))
    out = tmp_path / "sim"
    result = run_main(monkeypatch, capsys, "simulate", "--out", str(out), "--prompts", "4")
    assert result.code == code
    assert "inside a library call that ignored it" in result.message
    assert "its output is complete" in result.message
    assert load_rollouts(out)["prompt_id"].n_unique() == 4  # it is
    monkeypatch.setattr(simulate_module, "write_parquet_atomic", real)
    assert run_main(monkeypatch, capsys, "simulate", "--out", str(out), "--prompts", "4")[0] == 0


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_swallowed_inside_the_replay_stops_it_at_the_next_tick(
    monkeypatch, capsys, sim_dataset, tmp_path, sig, code
):
    """CI sent SIGTERM into a replay and a library swallowed it: the replay ran its 100,000
    repeats to the end and published. The progress tick now raises the swallowed interrupt
    again, so the run stops there, publishes nothing and says "terminated:" (130 / 143)."""
    import basis_bench.evaluation.run as run_module

    # after the first checkpoint's replay, as polars did
    monkeypatch.setattr(run_module, "summary_table", _swallowing(sig, run_module.summary_table))
    out = tmp_path / "results"
    result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))
    assert result.code == code
    word = "terminated" if sig == signal.SIGTERM else "interrupted"
    assert result.message.startswith(f"{word}:"), result.message
    assert not out.exists() and siblings(out) == []


# --------------------------------------------------------------------------- evaluate


def test_evaluate_removes_what_a_killed_run_left(monkeypatch, capsys, sim_dataset, tmp_path):
    out = tmp_path / "res"
    stale = [tmp_path / ".res.abc.staging", tmp_path / ".res.def.old"]
    for folder in stale:
        folder.mkdir()
        (folder / "summary.csv").write_text("x")
        (folder / LOCK_FILE).write_text("")  # its writer, killed, holds it no more
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0
    assert siblings(out) == []


def test_evaluate_writes_through_a_link(monkeypatch, capsys, sim_dataset, tmp_path):
    target = tmp_path / "scratch" / "results"
    target.mkdir(parents=True)
    link = tmp_path / "res"
    link.symlink_to(target)
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, link))[0] == 0
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, link))[0] == 0
    assert link.is_symlink() and (target / "run.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res", "scratch", "sim"]
    assert siblings(target) == []


def test_evaluate_refuses_the_current_folder(monkeypatch, capsys, sim_dataset, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    (here / "notes.txt").write_text("mine")
    monkeypatch.chdir(here)
    for out in (".", ".."):
        result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, Path(out)))
        assert_one_line_error(result, "the current folder")
    assert sorted(p.name for p in here.iterdir()) == ["notes.txt"]


def test_evaluate_keeps_a_group_shared_folder_shared(monkeypatch, capsys, sim_dataset, tmp_path):
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o2775)
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o2775


def test_a_second_writer_of_one_folder_is_refused(monkeypatch, capsys, sim_dataset, tmp_path):
    out = tmp_path / "res"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from basis_bench.guards.outputs import claim_output_dir; "
         f"claim_output_dir(Path({str(out)!r}), 'results'); print('held', flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = snapshot(out)
        result = run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))
        assert_one_line_error(result, "being written by another basis-bench command")
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, out))[0] == 0


# --------------------------------------------------------------------------- import


def test_an_interrupted_replace_keeps_the_old_data(monkeypatch, capsys, tmp_path):
    out = tmp_path / "ds"
    assert (
        run_main(monkeypatch, capsys, *import_args(counts_file(tmp_path, "a.csv", 1), out))[0] == 0
    )
    before = without_lock(snapshot(out))
    real_replace = os.replace
    calls = []

    def interrupted(src, dst):  # the interrupt lands after the old file was set aside
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(publishing_module.os, "replace", interrupted)
    args = import_args(counts_file(tmp_path, "b.csv", 3), out, "--replace")
    code, message, _ = run_main(monkeypatch, capsys, *args)
    assert code == 130 and message.startswith("interrupted:"), message
    monkeypatch.setattr(publishing_module.os, "replace", real_replace)
    assert without_lock(snapshot(out)) == before
    assert load_rollouts(out)["reward"].sum() == 2.0  # a: 1 of 4, b: 1 of 4


def test_import_sees_a_linked_policy_folder(monkeypatch, capsys, tmp_path):
    """A policy folder that is a link counts as held: no write through it without --replace."""
    out = tmp_path / "ds"
    assert (
        run_main(monkeypatch, capsys, *import_args(counts_file(tmp_path, "a.csv", 1), out))[0] == 0
    )
    elsewhere = tmp_path / "elsewhere"
    (out / "rollouts" / "ck").rename(elsewhere)
    (out / "rollouts" / "ck").symlink_to(elsewhere)
    before = snapshot(elsewhere)
    args = import_args(counts_file(tmp_path, "b.csv", 3), out)
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "already holds policy 'ck'")
    assert snapshot(elsewhere) == before


# --------------------------------------------------------------------------- train-figures


def test_train_figures_claims_its_folder(monkeypatch, capsys, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "training_summary.csv").write_text("my own table\n")
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"estimator": "basis", "group_size": 8, "loss": "gpg"})
    )
    append_jsonl(run / "log.jsonl", {"step": 1, "mean_reward": 0.5, "eval_accuracy": 0.25})
    result = run_main(monkeypatch, capsys, "train-figures", str(run), "--out", str(out))
    assert_one_line_error(result, "--force")
    assert snapshot(out) == before
    assert (
        run_main(monkeypatch, capsys, "train-figures", str(run), "--out", str(tmp_path / "f"))[0]
        == 0
    )


# --------------------------------------------------------------------------- train's log

TRAIN_TOML = ROOT / "experiments" / "cpu_smollm2_arithmetic.toml"


@pytest.mark.parametrize("target", ["missing", "empty", "a record"])
def test_train_refuses_a_log_linked_out_of_its_run_dir(monkeypatch, capsys, tmp_path, target):
    """``run_dir/log.jsonl`` a link to a file elsewhere: the log is appended in place, so
    the run would write there (a non-empty target was taken for a run already here, and
    a missing or empty one went ahead). Refused before a model loads or a byte is written."""
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    outside = elsewhere / "log.jsonl"
    if target != "missing":
        outside.write_text("" if target == "empty" else '{"step": 1, "mean_reward": 0.5}\n')
    (run / "log.jsonl").symlink_to(outside)
    before = snapshot(elsewhere)
    args = ["train", "--config", str(TRAIN_TOML), "--set", f'run_dir="{run}"']
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, f"{run / 'log.jsonl'} leads out of", "symbolic link")
    assert snapshot(elsewhere) == before and outside.exists() == (target != "missing")
    assert sorted(p.name for p in run.iterdir()) == ["log.jsonl"]


def test_a_log_linked_out_mid_run_is_never_appended_to(tmp_path):
    """A step's record goes to the run's own log only: a ``log.jsonl`` turned into a link to
    a file elsewhere after the run started is refused, one inside the run is followed."""
    from basis_bench.errors import InputError
    from basis_bench.guards.outputs import claim_output_dir

    run, outside = claim_output_dir(tmp_path / "run", "train-run"), tmp_path / "other.jsonl"
    outside.write_text("")
    record = {"step": 1, "mean_reward": 0.5}
    (run / "log.jsonl").symlink_to(outside)
    with pytest.raises(InputError, match=r"leads out of .* through a symbolic link"):
        append_jsonl(run / "log.jsonl", record)
    assert outside.read_text() == ""
    (run / "log.jsonl").unlink()
    (run / "logs").mkdir()
    (run / "log.jsonl").symlink_to(run / "logs" / "log.jsonl")
    append_jsonl(run / "log.jsonl", record)
    assert json.loads((run / "logs" / "log.jsonl").read_text()) == record


# --------------------------------------------------------------------------- values kept


def test_a_fixed_beta_off_the_grid_is_refused_not_moved(monkeypatch, capsys, sim_dataset, tmp_path):
    out = tmp_path / "res"
    args = evaluate_args(sim_dataset, out, "--calibration", "fixed", "--fixed-beta", "0.3")
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "not on the beta grid", "0.297279")
    assert not out.exists()  # refused before any folder was made
    on_grid = evaluate_args(sim_dataset, out, "--calibration", "fixed", "--fixed-beta", "0.297279")
    assert run_main(monkeypatch, capsys, *on_grid)[0] == 0
    recorded = json.loads((out / "run.json").read_text())
    assert "0.297279" in json.dumps(recorded)  # what ran is what the user typed


def test_a_failed_run_leaves_no_folder_it_made(tmp_path):
    """A claim's new folder goes again when the command fails before writing there."""
    from basis_bench.guards.outputs import claim_output_dir, holds_output_locks

    @holds_output_locks
    def fails(out: Path) -> None:
        claim_output_dir(out, "results")
        raise ValueError("late failure")

    with pytest.raises(ValueError, match="late failure"):
        fails(tmp_path / "new")
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(ValueError, match="late failure"):
        fails(kept)
    assert kept.is_dir()  # the user's folder stays, marker and all


# --------------------------------------------------------------------------- oracle


def test_a_pickled_checkpoint_is_one_line_and_never_run(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from basis_bench.errors import InputError
    from basis_bench.rollouts.models import resolve_checkpoint

    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    ckpt = tmp_path / "ckpt"
    transformers.LlamaForCausalLM(config).save_pretrained(ckpt)
    (ckpt / "model.safetensors").unlink()
    witness = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {witness}",))

    torch.save({"weight": Payload()}, ckpt / "pytorch_model.bin")
    from basis_bench.rollouts.models import load_model

    with pytest.raises(InputError, match="pickled objects beyond plain tensors") as caught:
        load_model(resolve_checkpoint(str(ckpt)), device="cpu")
    assert "weights_only=False" not in str(caught.value)
    assert not witness.exists()
