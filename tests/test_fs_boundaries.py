"""Outputs that never lie, third round (issue 35): cleanups that know their leftovers exactly,
links that lead out of a dataset, unreadable folders, outputs inside other data, and reads
bounded before they start.

Each case checks the exit code, the one-line message and that no earlier byte changed.
Permission cases run in a subprocess without the root override (``setpriv`` drops
CAP_DAC_OVERRIDE and friends), since the sandbox runs as root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    CliRun,
    assert_one_line_error,
    evaluate_args,
    run_main,
    siblings,
    snapshot,
)

import basis_bench
import basis_bench.evaluation.run as run_module
from basis_bench.guards.locks import LOCK_FILE
from basis_bench.rollouts.simulate import SimulationConfig, simulate
from basis_bench.rollouts.store import default_dataset

ROOT = Path(basis_bench.__file__).resolve().parents[1]  # subprocesses run the code under test
CLI = [sys.executable, "-m", "basis_bench"]
TRAIN_TOML = Path(__file__).resolve().parents[1] / "experiments" / "cpu_smollm2_arithmetic.toml"


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
    from basis_bench.guards.provenance import file_sha256
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


# --------------------------------------------------------------------------- 2: links leading out


def counts_source(tmp_path: Path) -> Path:
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,3\n")
    return source


@pytest.mark.parametrize("policy", ["reference", "new"])
def test_import_never_writes_or_deletes_through_a_link_out_of_the_dataset(
    monkeypatch, capsys, tmp_path, policy
):
    """``import --policy reference --replace --out d_main``, where ``d_main/rollouts/
    reference`` links into another dataset, deleted and rewrote that dataset's parts (and a
    new policy, with ``d_main/rollouts`` a link, was written into the other one)."""
    source = counts_source(tmp_path)
    other, main = tmp_path / "other", tmp_path / "d_main"
    run = ["import", "counts", str(source), "--out"]
    assert run_main(monkeypatch, capsys, *run, str(other), "--policy", "reference").code == 0
    assert run_main(monkeypatch, capsys, *run, str(main), "--policy", "ck").code == 0
    if policy == "reference":
        (main / "rollouts" / "reference").symlink_to(other / "rollouts" / "reference")
    else:
        shutil.move(main / "rollouts", other / "rollouts" / "ck-of-main")
        (main / "rollouts").symlink_to(other / "rollouts")
    before = snapshot(other), snapshot(main)
    args = [*run, str(main), "--policy", policy, "--replace"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "through a symbolic link")
    assert (snapshot(other), snapshot(main)) == before


def test_a_simulate_rerun_never_removes_files_through_a_link_out(monkeypatch, capsys, tmp_path):
    """A rerun removed the earlier simulation's files it did not rewrite, found through a
    link in ``rollouts/`` to another simulated dataset: that dataset's files."""
    sim, other = tmp_path / "sim", tmp_path / "other"
    for out in (sim, other):
        simulate(SimulationConfig(n_prompts=4, ref_n=4, checkpoint_n=6), out)
    (sim / "rollouts" / "other").symlink_to(other / "rollouts")
    before = snapshot(other)
    args = ["simulate", "--out", str(sim), "--prompts", "4", "--seed", "1"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "through a symbolic link")
    assert snapshot(other) == before


def test_no_write_under_a_claimed_folder_goes_through_a_link_out(tmp_path):
    """The one writer (atomic_write: a training run's rollouts and logs, every part, table
    and figure) asks the same: a link inside the claimed folder may not lead the write out."""
    from basis_bench.errors import InputError
    from basis_bench.guards.outputs import claim_output_dir, write_text_atomic

    run, elsewhere = claim_output_dir(tmp_path / "run", "train-run"), tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "rollouts").symlink_to(elsewhere)
    with pytest.raises(InputError, match="through a symbolic link"):
        write_text_atomic(run / "rollouts" / "train-000001.parquet", "x")
    (run / "inner").mkdir()
    (run / "same").symlink_to(run / "inner")  # a link that stays inside is followed
    write_text_atomic(run / "same" / "x.txt", "x")
    assert list(elsewhere.iterdir()) == [] and (run / "inner" / "x.txt").is_file()


# --------------------------------------------------------------------------- 5: outputs inside data


def make_run(tmp_path: Path) -> Path:
    """A training run's folder as train-figures reads it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text('{"estimator": "grpo", "group_size": 4, "loss": "gpg"}')
    (run / "log.jsonl").write_text('{"step": 1, "mean_reward": 0.5}\n')
    return run


def commands_writing(out: Path, data: Path, results: Path, run: Path) -> dict[str, list[str]]:
    """Every command's arguments that write into ``out`` (train's run_dir too)."""
    source = data.parent / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,3\n")
    return {
        "evaluate": evaluate_args(data, out),
        "sensitivity": [
            "sensitivity",
            "--rollouts",
            str(data),
            "--out",
            str(out),
            "--repeats",
            "2",
        ],
        "figures": ["figures", "--results", str(results), "--out", str(out)],
        "train-figures": ["train-figures", str(run), "--out", str(out)],
        "train": ["train", "--config", str(TRAIN_TOML), "--set", f"run_dir={out}"],
        "import": ["import", "counts", str(source), "--policy", "ck", "--out", str(out)],
        "simulate": ["simulate", "--out", str(out), "--prompts", "4"],
    }


@pytest.mark.parametrize(
    "command",
    ["evaluate", "sensitivity", "figures", "train-figures", "train", "import", "simulate"],
)
def test_no_command_writes_inside_another_dataset_at_any_depth(
    monkeypatch, capsys, sim_dataset, tmp_path, command
):
    """``evaluate --rollouts A --out B/results`` wrote B's tables where B's readers took
    estimates.parquet for a rollouts part; ``train --set run_dir=B/run`` added a policy
    train-000001 to B. Refused for every command, however deep, before a model loads."""
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    other = tmp_path / "other"
    simulate(SimulationConfig(n_prompts=6, ref_n=4, checkpoint_n=6, seed=3), other)
    results = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results)).code == 0
    run, before = make_run(tmp_path), snapshot(other)
    for out in (other / "results", other / "rollouts" / "a" / "b"):
        args = commands_writing(out, sim_dataset, results, run)
        result = run_main(monkeypatch, capsys, *args[command])
        assert_one_line_error(result, "is inside the rollouts dataset", str(other))
    assert snapshot(other) == before


@pytest.mark.parametrize("command", ["evaluate", "import", "train-figures"])
def test_no_output_goes_inside_a_results_folder_or_a_training_run(
    monkeypatch, capsys, sim_dataset, tmp_path, command
):
    """A results folder is swapped whole by its next run and a training run's folder holds
    its own rollouts: an output inside either was copied along, or read as its data."""
    results = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results)).code == 0
    run = make_run(tmp_path)
    (run / ".basis-bench-output.json").write_text('{"kind": "train-run"}')
    before = snapshot(results)
    for outer, what in ((results, "a results folder"), (run, "a training run")):
        args = commands_writing(outer / "x" / "y", sim_dataset, results, run)
        assert_one_line_error(run_main(monkeypatch, capsys, *args[command]), f"inside {what}")
    assert snapshot(results) == before and not (run / "x").exists()


# --------------------------------------------------------------------------- 3: unreadable folders

SETPRIV = shutil.which("setpriv")
NO_OVERRIDE = "--bounding-set=-dac_override,-dac_read_search,-fowner"


def as_a_user(*args: str) -> subprocess.CompletedProcess[str]:
    """``basis-bench ARGS`` as a user runs it: root's override of file permissions dropped
    (the sandbox runs as root, which reads every folder whatever its mode)."""
    if os.geteuid() != 0:
        return cli(*args)
    if SETPRIV is None:
        pytest.skip("setpriv (util-linux) is needed to run without root's permission override")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [SETPRIV, NO_OVERRIDE, *CLI, *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


@pytest.fixture
def default_copy(tmp_path) -> Path:
    """The shipped dataset (96 prompts, 24 parts a policy), to break by hand."""
    out = tmp_path / "data"
    shutil.copytree(default_dataset(), out)
    return out


@pytest.mark.parametrize("hidden", ["policy", "some parts"])
def test_evaluate_stops_at_an_unreadable_folder_naming_it(default_copy, tmp_path, hidden):
    """With ``rollouts/late`` unreadable evaluate exited 0 without late; with 10 of late's
    parts in an unreadable subfolder it evaluated late on 56 of 96 prompts."""
    late = default_copy / "rollouts" / "late"
    locked = late
    if hidden == "some parts":
        locked = late / "old"
        locked.mkdir()
        for part in sorted(late.glob("*.parquet"))[:10]:
            part.rename(locked / part.name)
    locked.chmod(0)
    try:
        result = as_a_user(*evaluate_args(default_copy, tmp_path / "res"))
    finally:
        locked.chmod(0o755)
    assert_one_line_error(result, str(locked), "cannot read this folder")
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("locked", ["old", "part-000000.parquet"])
def test_import_replace_stops_at_old_parts_it_cannot_read(tmp_path, locked):
    """``import --replace`` said "(replaced)" while old parts in an unreadable subfolder
    survived, to mix with the new rows once readable; an unreadable part was a bare
    "permission denied" naming no file."""
    data, source = tmp_path / "d", tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,3\n")
    args = ["import", "counts", str(source), "--policy", "ck", "--out", str(data)]
    assert cli(*args).returncode == 0
    policy = data / "rollouts" / "ck"
    (policy / "old").mkdir()
    shutil.copy(policy / "part-000000.parquet", policy / "old" / "part-000000.parquet")
    before = snapshot(data)
    (policy / locked).chmod(0)
    try:
        result = as_a_user(*args, "--replace")
    finally:
        (policy / locked).chmod(0o755)
    assert_one_line_error(result, str(policy / locked), "read")
    assert snapshot(data) == before


# --------------------------------------------------------------------------- 7: bounded reads


def test_links_back_into_a_dataset_are_walked_once(monkeypatch, capsys, default_copy, tmp_path):
    """Two links to ``.`` inside ``rollouts/`` made the folder walk exponential (still
    walking at 90 s); each real folder is visited once, so the dataset reads as itself."""
    for name in ("again", "more"):
        (default_copy / "rollouts" / name).symlink_to(".")
    lister = "import sys; from basis_bench.rollouts.store import rollout_files as f; print(len(f(sys.argv[1])))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run([sys.executable, "-c", lister, str(default_copy)], env=env,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert listed.stdout.strip() == "96"  # 4 policies x 24 parts, each once
    result = run_main(monkeypatch, capsys, *evaluate_args(default_copy, tmp_path / "res"))
    assert result.code == 0, result.message


@pytest.mark.parametrize("option", ["--rollouts", "--rollouts=", "--out"])
def test_an_empty_path_is_refused_not_taken_for_the_current_folder(
    monkeypatch, capsys, sim_dataset, tmp_path, option
):
    """``--rollouts ''`` was taken silently as the current folder (in a folder holding link
    loops: out of memory at 19 GB); ``import --out ''`` wrote a dataset there."""
    here = tmp_path / "here"
    here.mkdir()
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\n")
    if option == "--out":
        monkeypatch.chdir(here)
        args = ["import", "counts", str(source), "--policy", "ck", "--out", ""]
    else:
        monkeypatch.chdir(sim_dataset)
        args = evaluate_args(Path("."), here / "res")
        at = args.index("--rollouts")
        args[at : at + 2] = [option] if option.endswith("=") else [option, ""]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, f"{option.rstrip('=')} is empty")
    assert list(here.iterdir()) == []


def test_train_refuses_an_empty_run_dir(monkeypatch, capsys, tmp_path):
    """``--set run_dir=`` claimed the current folder as a training run."""
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    monkeypatch.chdir(tmp_path)
    args = ["train", "--config", str(TRAIN_TOML), "--set", "run_dir="]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "run_dir is empty")
    assert list(tmp_path.iterdir()) == []


def test_a_train_start_refused_after_the_claim_leaves_no_run_dir(monkeypatch, capsys, tmp_path):
    """train() lost its ``holds_output_locks`` to the step helper split off above it, so a
    start refused after run_dir was claimed (a prompt file that does not exist) left the
    folder behind, with the marker and a held lock."""
    run_dir, missing = tmp_path / "run", tmp_path / "none.jsonl"
    args = ["train", "--config", str(TRAIN_TOML), "--set", f'train_prompts="{missing}"',
            "--set", f'run_dir="{run_dir}"']  # fmt: skip
    assert_one_line_error(run_main(monkeypatch, capsys, *args), str(missing), "does not exist")
    assert not run_dir.exists()


CGROUP = Path("/sys/fs/cgroup")


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[Path]:
    """A fresh memory cgroup (v2, or v1 as here) below this process's, limited to ``limit``
    bytes, as SLURM or Docker make one; skipped where this process may not make one."""
    own = {
        c: p
        for _, c, p in (
            line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()
        )
    }
    if (CGROUP / "cgroup.controllers").exists():
        base, limit_file = CGROUP / own.get("", "/").strip().lstrip("/"), "memory.max"
    else:
        memory = next((p for c, p in own.items() if "memory" in c.split(",")), None)
        if memory is None:
            pytest.skip("no memory cgroup controller on this machine")
        base, limit_file = (
            CGROUP / "memory" / memory.strip().lstrip("/"),
            "memory.limit_in_bytes",
        )
    group = base / f"basis-bench-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit))
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup here ({err})")
    try:
        yield group
    finally:
        group.rmdir()


def test_the_memory_guard_reads_the_cgroup_limit(tmp_path):
    """In a memory cgroup (SLURM, Docker) ``import counts`` of many rows passed the guard,
    which read the host's free memory, and was killed without a word."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\n" + "".join(f"p{i},100000,5\n" for i in range(100)))
    args = ["import", "counts", str(source), "--policy", "ck", "--out", str(tmp_path / "d")]
    with memory_cgroup(256 * 2**20) as group:
        result = in_cgroup(group, *args)
    assert_one_line_error(result, "10,000,000 rollouts", "cgroup")
    assert not (tmp_path / "d").exists()


def in_cgroup(group: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``basis-bench ARGS`` in the cgroup ``group``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    enter = f'echo $$ > {group / "cgroup.procs"} && exec "$@"'
    return subprocess.run(["sh", "-c", enter, "sh", *CLI, *args], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip


def test_rows_a_footer_declares_are_checked_before_reading(sim_dataset, tmp_path):
    """A few-MB part holding millions of identical rows (repeated keys: the streaming reader
    hands it to the full one) aborted polars with an allocation failure; the rows its
    footer declares are checked against free memory first."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 1 << 20
    block = pa.table({"prompt_id": pa.array(["sim-00"] * rows), "policy": pa.array(["late"] * rows),
                      "sample_idx": pa.array(np.zeros(rows, np.int32)),
                      "reward": pa.array(np.ones(rows))})  # fmt: skip
    part = sim_dataset / "rollouts" / "dup.parquet"
    with pq.ParquetWriter(part, block.schema, compression="zstd") as writer:
        for _ in range(20):
            writer.write_table(block)
    assert part.stat().st_size < 4 << 20
    with memory_cgroup(384 * 2**20) as group:
        result = in_cgroup(group, *evaluate_args(sim_dataset, tmp_path / "res"))
    assert_one_line_error(result, "20,971,", "rollouts at once", "footer")


def test_a_model_is_sized_from_its_metadata_before_it_is_built(tmp_path):
    """A 96-byte .gguf declaring only ``general.architecture=llama`` made the oracle build a
    default-size Llama (6.6B parameters, ~27 GB): refused from its header, nothing built."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = tmp_path / "out"
    args = ["oracle", "--model", str(path), "--policy", "p", "--prompts", "arithmetic:n=4,seed=3",
            "--n", "2", "--device", "cpu", "--workers", "1", "--out", str(out)]  # fmt: skip
    with memory_cgroup(3 * 2**30) as group:  # where the old behaviour is a kill, not a swap storm
        result = in_cgroup(group, *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # after the oracle's plan
    assert last.startswith("error:") and "6,607,343,616 parameters" in last, last
    assert "holds 0 weights" in last and not out.exists()


@pytest.mark.parametrize("where", ["rollouts/late/part-999999.parquet", "prompts.parquet"])
def test_a_fifo_in_a_dataset_is_refused_not_waited_on(default_copy, tmp_path, where):
    """Found while hunting the next class: opening a FIFO named like a part blocked evaluate
    for good, deaf to SIGTERM."""
    fifo = default_copy / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*CLI, *evaluate_args(default_copy, tmp_path / "res")],
                            capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert_one_line_error(result, str(fifo), "not a regular file")


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["import", "counts", "FIFO", "--policy", "p", "--out", "OUT"], "counts.csv"),
        (["import", "eval-jsonl", "FIFO", "--policy", "p", "--out", "OUT"], "evals.jsonl"),
        (["import", "counts", "SRC", "--prompts", "FIFO", "--policy", "p", "--out", "OUT"],
         "prompts.csv"),
        (["oracle", "--prompts", "FIFO", "--model", "smollm2-135m", "--policy", "p", "--n", "2",
          "--device", "cpu", "--out", "OUT"], "prompts.jsonl"),
        (["train", "--config", str(TRAIN_TOML), "--set", 'train_prompts="FIFO"', "--set",
          'run_dir="OUT"'], "prompts.json"),
        (["train", "--config", "FIFO", "--set", 'run_dir="OUT"'], "config.toml"),
    ],
)  # fmt: skip
def test_a_fifo_named_as_a_source_or_prompt_file_is_refused_not_waited_on(tmp_path, args, name):
    """A FIFO given as an import source, a prompt file or a config is refused as the dataset's
    readers refuse one, by what it is (it was "does not exist": the readers asked only
    ``is_file``, and opening it waits for a writer that never comes)."""
    fifo, out, source = tmp_path / name, tmp_path / "out", tmp_path / "src.csv"
    os.mkfifo(fifo)
    source.write_text("prompt_id,n,n_correct\na,4,1\n")
    named = {"FIFO": str(fifo), "OUT": str(out), "SRC": str(source)}
    args = [named.get(a, a).replace('"FIFO"', f'"{fifo}"').replace('"OUT"', f'"{out}"')
            for a in args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=120)
    last = result.stderr.strip().splitlines()[-1]  # after train's plan line
    assert "Traceback" not in result.stderr
    assert_one_line_error(CliRun(result.returncode, last, ""), str(fifo), "not a regular file")
    assert not out.exists()
