"""`basis-bench oracle`: sharding, resumption after SIGKILL, the files it writes, bad input,
and an end-to-end run of the real SmolLM2 model on CPU."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import CLI, ONE_THREAD, assert_one_line_error, run_cli
from typer.testing import CliRunner

from basis_bench.cli.app import app
from basis_bench.errors import InputError
from basis_bench.guards.outputs import read_metadata
from basis_bench.rollouts.models import resolve_checkpoint
from basis_bench.rollouts.oracle import (
    pending_chunks,
    plan_chunks,
    run_identity,
)
from basis_bench.rollouts.oracle_job import OracleJob, Shard
from basis_bench.rollouts.oracle_workers import auto_workers, free_cores
from basis_bench.rollouts.prompts import arithmetic_prompts
from basis_bench.rollouts.store import (
    dataset_metadata,
    load_prompts,
    load_rollouts,
    write_prompts_table,
)
from basis_bench.rollouts.templates import DEFAULT_INSTRUCTION, FAMILY_INSTRUCTIONS
from basis_bench.rollouts.training_record import (
    STEPS_KEY,
    part_steps,
    read_training_record,
    training_record,
)
from basis_bench.schema import OPTIONAL_ROLLOUT_COLUMNS, PROMPTS_FILE, ROLLOUT_COLUMNS
from basis_bench.settings import made, replaced

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "math_sample.jsonl"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def job_of(**values) -> OracleJob:
    """A job from its settings by flat key, as the command line gives them."""
    return made(OracleJob, values)


def parts(out: Path, policy: str) -> list[Path]:
    return sorted((out / "rollouts" / policy).glob("part-*.parquet"))


def tiny_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "oracle",
        "--model", str(model),
        "--policy", "tiny",
        "--prompts", "arithmetic:n=6,digits=1-2,steps=1-2,seed=5",
        "--n", "3",
        "--max-new-tokens", "16",
        "--chunk-size", "1",
        "--device", "cpu",
        "--out", str(out),
        *extra,
    ]  # fmt: skip


def started_until_a_part(args: list[str], out: Path) -> subprocess.Popen:
    """The oracle CLI started in a process of its own, once its first part is written in
    ``out`` (or it ended, or 240 s passed): where a kill test strikes."""
    job = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ONE_THREAD
    )
    deadline = time.monotonic() + 240
    while not parts(out, "tiny") and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return job


# --------------------------------------------------------------------------- sharding


def test_shard_parse():
    assert Shard.parse("0/1") == Shard(0, 1)
    assert Shard.parse(" 2 / 4 ") == Shard(2, 4)
    for bad in ("3/2", "2/2", "1/0", "a/b", "1", "-1/2"):
        with pytest.raises(InputError, match="--shard"):
            Shard.parse(bad)


def test_shards_partition_the_chunks_and_chunks_do_not_depend_on_shards():
    prompts = arithmetic_prompts(23, digits=2, steps=2, seed=0)
    chunks = plan_chunks(prompts, 5)
    assert [c.prompts.height for c in chunks] == [5, 5, 5, 5, 3]
    assert pl.concat([c.prompts for c in chunks]).equals(prompts)
    owned = [[c.index for c in chunks if Shard(i, 3).owns(c.index)] for i in range(3)]
    assert sorted(i for shard in owned for i in shard) == list(range(len(chunks)))
    assert owned == [[0, 3], [1, 4], [2]]


def test_chunk_seed_depends_on_base_seed_and_chunk_content():
    prompts = arithmetic_prompts(6, digits=2, steps=2, seed=0)
    a, b = plan_chunks(prompts, 3)
    assert a.seed(0) == plan_chunks(prompts, 3)[0].seed(0)
    assert len({a.seed(0), a.seed(1), b.seed(0)}) == 3
    assert 0 <= a.seed(0) < 2**31


def test_policy_and_chunk_size_are_checked():
    job = {"model": "m", "prompts": "arithmetic:n=2", "out": Path("o"), "n": 2}
    with pytest.raises(InputError, match="--policy"):
        job_of(policy="../up", **job)
    with pytest.raises(InputError, match="--chunk-size"):
        job_of(policy="ok", **job, chunk_size=0)


# --------------------------------------------------------------------------- prompts table


def test_prompts_table_is_idempotent_merges_and_refuses_conflicts(tmp_path):
    first = arithmetic_prompts(4, digits=2, steps=1, seed=0)
    path = write_prompts_table(first, tmp_path, {"dataset": "a"})
    mtime = path.stat().st_mtime_ns
    write_prompts_table(first, tmp_path, {"dataset": "a"})
    assert path.stat().st_mtime_ns == mtime  # identical content: left alone
    more = arithmetic_prompts(6, digits=2, steps=1, seed=0)  # the first 4 plus 2 new
    write_prompts_table(more, tmp_path, {"dataset": "b"})
    merged = load_prompts(tmp_path)
    assert merged is not None and set(merged["prompt_id"]) == set(more["prompt_id"])
    assert read_metadata(path) == {"dataset": "b"}
    clash = first.with_columns(pl.lit("999").alias("answer"))
    with pytest.raises(InputError, match="already holds prompt"):
        write_prompts_table(clash, tmp_path, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == [PROMPTS_FILE]  # nothing staged left


# --------------------------------------------------------------------------- bad input


def bad_oracle_run(
    model: str | Path, prompts: str | Path, out: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """``basis-bench oracle`` of policy p, in a fresh interpreter (it fails before a model
    loads)."""
    args = ["oracle", "--model", str(model), "--policy", "p", "--prompts", str(prompts)]
    return run_cli([*args, "--out", str(out), *extra])


def test_unknown_model_path(tmp_path):
    result = bad_oracle_run(tmp_path / "nope", SAMPLE, tmp_path / "o")
    assert_one_line_error(result, "no such model", "smollm2-135m")
    (tmp_path / "not-a-model").mkdir()
    result = bad_oracle_run(tmp_path / "not-a-model", SAMPLE, tmp_path / "o")
    assert_one_line_error(result, "without config.json")


def test_empty_prompt_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    result = bad_oracle_run("smollm2-135m", tmp_path / "empty.jsonl", tmp_path / "o")
    assert_one_line_error(result, "empty")


def test_malformed_jsonl_line_is_reported_with_its_number(tmp_path):
    lines = SAMPLE.read_text().splitlines()[:4]
    lines[2] = lines[2][:40]  # line 3 cut short
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    result = bad_oracle_run("smollm2-135m", tmp_path / "bad.jsonl", tmp_path / "o")
    assert_one_line_error(result, "bad.jsonl:3:", "not a JSON record")


def test_shard_out_of_range(tmp_path):
    result = bad_oracle_run("smollm2-135m", SAMPLE, tmp_path / "o", "--shard", "3/2")
    assert_one_line_error(result, "--shard 3/2")
    assert not (tmp_path / "o").exists()


def test_out_must_be_a_directory(tmp_path):
    (tmp_path / "file").write_text("x")
    result = bad_oracle_run("smollm2-135m", "arithmetic:n=2", tmp_path / "file")
    assert_one_line_error(result, "is a file")


def test_third_party_progress_bars_stay_out_of_a_log(tiny_model, tmp_path):
    """stderr into a file or pipe: transformers' "Loading weights" bar would be a line of
    carriage returns there; this project's own progress lines stay."""
    done = run_cli(tiny_args(tiny_model, tmp_path / "o"))
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "Loading weights" not in done.stderr, done.stderr
    assert "wrote 6 part(s), 18 rollouts" in done.stderr


# --------------------------------------------------------------------------- resumption


def test_sigkill_mid_run_then_rerun_equals_an_uninterrupted_run(tiny_model, tmp_path):
    # The killed job runs in its own process; the uninterrupted run and the rerun run
    # in this one (same code, same torch threads), which saves two interpreter starts.
    runner = CliRunner()
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    done = runner.invoke(app, tiny_args(tiny_model, whole))
    assert done.exit_code == 0, done.output
    assert len(parts(whole, "tiny")) == 6

    job = started_until_a_part(tiny_args(tiny_model, resumed), resumed)
    os.kill(job.pid, signal.SIGKILL)
    job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL
    written = len(parts(resumed, "tiny"))
    assert 1 <= written < 6, (
        f"the kill came too late to test resumption ({written} of 6 parts written)"
    )

    rerun = runner.invoke(app, tiny_args(tiny_model, resumed, "--step", "12"))
    assert rerun.exit_code == 0, rerun.output
    assert f"{written} already complete" in " ".join(rerun.output.split())
    assert len(parts(resumed, "tiny")) == 6
    record = read_training_record(resumed)  # --step: where the checkpoint sat in training
    assert record is not None and record.steps == {"tiny": 12}
    # and the parts written with --step carry it (those of the killed run predate it)
    assert part_steps(resumed) == {"tiny": 12} and training_record(resumed) == record

    expected, got = load_rollouts(whole), load_rollouts(resumed)
    assert got.height == 6 * 3
    assert got.select("prompt_id", "policy", "sample_idx").is_unique().all()
    assert got.equals(expected)
    assert load_prompts(resumed).equals(load_prompts(whole))  # type: ignore[union-attr]


def test_shards_fill_the_same_dataset_as_one_job_and_reruns_skip(tiny_model, tmp_path):
    runner = CliRunner()
    one, sharded = tmp_path / "one", tmp_path / "sharded"
    args = [
        "--prompts",
        "arithmetic:n=5,digits=2,steps=1,seed=1",
        "--chunk-size",
        "2",
        "--n",
        "3",
        "--max-new-tokens",
        "8",
    ]
    base = ["oracle", "--model", str(tiny_model), "--policy", "tiny", "--device", "cpu", *args]
    assert runner.invoke(app, [*base, "--out", str(one)]).exit_code == 0
    for shard in ("1/2", "0/2"):
        result = runner.invoke(app, [*base, "--out", str(sharded), "--shard", shard])
        assert result.exit_code == 0, result.output
    assert load_rollouts(sharded).equals(load_rollouts(one))
    assert {m["shard"] for m in dataset_metadata(sharded)} == {"0/2", "1/2"}
    # every part records the provenance run.json records
    assert all(
        {"git_commit", "date_utc", "versions"} <= set(m["provenance"])
        for m in dataset_metadata(sharded)
    )

    rerun = runner.invoke(app, [*base, "--out", str(one)])
    assert rerun.exit_code == 0
    assert "nothing to do" in rerun.output

    changed = runner.invoke(app, [*base, "--out", str(one), "--seed", "1"])
    assert isinstance(changed.exception, InputError)
    assert "different settings (seed)" in str(changed.exception)


def test_resuming_with_other_settings_is_refused(tmp_path):
    prompts = arithmetic_prompts(2, digits=2, steps=1, seed=0)
    job = job_of(
        model="m", policy="p", prompts="arithmetic:n=2", out=tmp_path, n=2, chunk_size=1,
        instruction="i",
    )  # fmt: skip
    identity = run_identity(job, {"name": "m", "path": "/m"})
    path = tmp_path / "rollouts" / "p" / "part-000000.parquet"
    path.parent.mkdir(parents=True)
    meta = {"run": identity, "chunk": {"digest": plan_chunks(prompts, 1)[0].digest()}}
    from basis_bench.guards.outputs import write_parquet_atomic

    write_parquet_atomic(pl.DataFrame({"x": [1]}), path, meta)
    todo, done = pending_chunks(prompts, job, identity)
    assert [c.index for c in todo] == [1] and [c.index for c in done] == [0]
    other = run_identity(job, {"name": "m2", "path": "/m2"})
    with pytest.raises(InputError, match=r"different settings \(model\)"):
        pending_chunks(prompts, job, other)
    with pytest.raises(InputError, match="the chunk's prompts"):
        pending_chunks(prompts.reverse(), job, identity)
    # a part that records another training step for the policy: resuming would mix two
    write_parquet_atomic(pl.DataFrame({"x": [1]}), path, {**meta, STEPS_KEY: {"p": 5}})
    with pytest.raises(InputError, match=r"different settings \(--step 5\)"):
        pending_chunks(prompts, replaced(job, step=6), identity)
    for step in (5, None):  # the same step, or none given: resumes
        assert len(pending_chunks(prompts, replaced(job, step=step), identity)[1]) == 1


# --------------------------------------------------------------------------- defaults


def test_each_prompt_family_has_a_default_instruction_the_run_records():
    job = {"model": "m", "policy": "p", "out": Path("o"), "n": 2}
    arithmetic = job_of(prompts="arithmetic:n=2", **job)
    assert arithmetic.template.instruction == FAMILY_INSTRUCTIONS["arithmetic"]
    assert arithmetic.sampling.max_new_tokens == 48
    assert arithmetic.reward.answer_format == "number"
    identity = run_identity(arithmetic, {"name": "m"})
    assert identity["template"]["instruction"] == FAMILY_INSTRUCTIONS["arithmetic"]
    assert identity["sampling"]["max_new_tokens"] == 48

    own = job_of(prompts="arithmetic:n=2", instruction="Think step by step.", **job)
    assert own.template.instruction == "Think step by step."
    assert own.sampling.max_new_tokens == 256  # room for the working it asks for
    assert job_of(prompts="arithmetic:n=2", instruction="", **job).template.instruction == ""

    math = job_of(prompts=str(SAMPLE), **job)
    assert math.template.instruction == DEFAULT_INSTRUCTION
    assert math.sampling.max_new_tokens == 3072


def test_auto_workers_use_the_free_cores_and_never_exceed_the_chunks(tmp_path):
    job = job_of(model="m", policy="p", prompts="arithmetic:n=2", out=tmp_path, device="cpu")
    assert 1 <= free_cores() <= len(os.sched_getaffinity(0))
    assert 1 <= auto_workers(job, 100) <= len(os.sched_getaffinity(0))
    assert auto_workers(job, 1) == 1
    assert auto_workers(replaced(job, workers=3), 2) == 2
    assert auto_workers(replaced(job, workers=3), 5) == 3
    assert auto_workers(replaced(job, backend="vllm", device="auto"), 100) == 1


def test_workers_write_the_same_dataset_as_one_process(tiny_model, tmp_path):
    runner = CliRunner()
    one, two = tmp_path / "one", tmp_path / "two"
    for out, workers in ((one, "1"), (two, "2")):
        result = runner.invoke(app, tiny_args(tiny_model, out, "--workers", workers))
        assert result.exit_code == 0, result.output
        output = " ".join(result.output.split())
        assert (
            f"{workers} sampling worker(s)" in output and "wrote 6 part(s), 18 rollouts" in output
        )
    assert load_rollouts(two).equals(load_rollouts(one))
    assert load_prompts(two).equals(load_prompts(one))  # type: ignore[union-attr]


def test_sigkill_of_a_run_with_workers_stops_them_and_the_rerun_completes(tiny_model, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert CliRunner().invoke(app, tiny_args(tiny_model, whole, "--workers", "1")).exit_code == 0
    job = started_until_a_part(tiny_args(tiny_model, resumed, "--workers", "2"), resumed)
    children = Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()
    os.kill(job.pid, signal.SIGKILL)
    job.wait(timeout=30)
    assert len(children) >= 2  # the two workers (and multiprocessing's resource tracker)
    deadline = time.monotonic() + 120
    while any(Path(f"/proc/{pid}").exists() for pid in children):
        assert time.monotonic() < deadline, "a worker outlived its killed run"
        time.sleep(0.05)
    assert 1 <= len(parts(resumed, "tiny")) < 6

    rerun = CliRunner().invoke(app, tiny_args(tiny_model, resumed, "--workers", "2"))
    assert rerun.exit_code == 0, rerun.output
    assert load_rollouts(resumed).equals(load_rollouts(whole))


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tiny_model, tmp_path):
    result = run_cli(tiny_args(tiny_model, tmp_path / "log", "--workers", "2"))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("tiny on hf: ")]
    # one line per part written (and every 30 s), each with every figure
    assert len(lines) >= 6, result.stderr
    pattern = (
        r"tiny on hf: \d+/18 samples, \d/6 prompts, [\d.]+ samples/s, [\d.,]+ tokens/s, "
        r"ETA (\d+:\d\d:\d\d|--:--:--), elapsed \d+:\d\d:\d\d"
    )
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    assert lines[-1].startswith("tiny on hf: 18/18 samples, 6/6 prompts")
    assert "\r" not in result.stderr and "\x1b[" not in result.stderr  # no live bar


# --------------------------------------------------------------------------- prompt features


def test_hidden_features_are_stored_once_beside_unchanged_rollouts(tiny_model, tmp_path):
    """--store-features hidden on a finished run adds the model's last-prompt-token hidden states
    to prompts.parquet and leaves every part as it was; a rerun computes nothing; a fresh
    run with two workers stores the same features."""
    import numpy as np

    from basis_bench.rollouts.oracle import OracleSource, open_source, run_oracle
    from basis_bench.rollouts.sampling.hf import HFSampler

    runner = CliRunner()
    out = tmp_path / "run"
    assert runner.invoke(app, tiny_args(tiny_model, out, "--workers", "1")).exit_code == 0
    before = {f: f.read_bytes() for f in parts(out, "tiny")}
    assert "features" not in load_prompts(out).columns  # type: ignore[union-attr]
    result = runner.invoke(app, tiny_args(tiny_model, out, "--store-features", "hidden"))
    assert result.exit_code == 0, result.output
    assert "computing the hidden states of 6 prompts" in result.output  # the pass is announced
    assert "hidden states of 6 prompts (--device cpu): done in" in result.output
    assert {f: f.read_bytes() for f in parts(out, "tiny")} == before
    prompts = load_prompts(out)
    assert prompts is not None and prompts.schema["features"] == pl.List(pl.Float32)
    stored = np.asarray(prompts["features"].to_list())

    job = job_of(
        model=str(tiny_model),
        policy="tiny",
        prompts="arithmetic:n=6,digits=1-2,steps=1-2,seed=5",
        out=out,
        n=3,
        max_new_tokens=16,
        chunk_size=1,
        device="cpu",
    )
    sampler = HFSampler.load(resolve_checkpoint(str(tiny_model)), "cpu", job.template)
    direct = sampler.prompt_hidden_states(prompts["problem"].to_list())
    assert stored.shape == (6, 32) and np.allclose(stored, direct, atol=1e-5)
    assert np.linalg.matrix_rank(stored) == 6  # one distinct vector per prompt

    job = replaced(job, store_features="hidden")
    own = open_source(job, print)
    source = OracleSource(own.prompts, own.model, lambda: 1 / 0)
    run_oracle(job, source=source)  # every part and every feature there: no model loaded
    two = tmp_path / "two"
    args = tiny_args(tiny_model, two, "--workers", "2", "--store-features", "hidden")
    assert runner.invoke(app, args).exit_code == 0
    again = load_prompts(two)
    assert again is not None and np.allclose(np.asarray(again["features"].to_list()), stored)


def test_prompts_table_fills_a_column_it_lacks_for_its_own_prompts(tmp_path):
    first = arithmetic_prompts(4, digits=2, steps=1, seed=0)
    write_prompts_table(first, tmp_path, {})
    more = arithmetic_prompts(5, digits=2, steps=1, seed=0).with_columns(
        pl.Series("features", [[float(i), 1.0] for i in range(5)])
    )
    write_prompts_table(more, tmp_path, {})
    merged = load_prompts(tmp_path)
    assert merged is not None and merged.height == 5
    assert merged["features"].to_list() == more["features"].to_list()
    write_prompts_table(first.head(2), tmp_path, {})  # fewer columns: nothing dropped
    assert load_prompts(tmp_path).equals(merged)  # type: ignore[union-attr]


def test_features_of_a_backend_without_hidden_states_come_first_from_transformers(
    tiny_model, tmp_path
):
    """--backend vllm --store-features hidden: the job's source computes the features with
    transformers (same folder, device and dtype) before the sampler is made, so they equal
    the hf backend's; an hf job has no such step (its sampler gives them)."""
    import numpy as np

    from basis_bench.rollouts.oracle import JobHiddenStates, JobSampler, open_source, run_oracle

    hf = job_of(
        model=str(tiny_model), policy="tiny", prompts="arithmetic:n=6,digits=1-2,steps=1-2,seed=5",
        out=tmp_path / "hf", n=2, max_new_tokens=8, chunk_size=3, device="cpu", workers=1,
        store_features="hidden",
    )  # fmt: skip
    run_oracle(hf)
    expected = np.asarray(load_prompts(hf.out)["features"].to_list())  # type: ignore[index]
    assert expected.shape == (6, 32)
    vllm = replaced(hf, backend="vllm", out=tmp_path / "vllm")
    assert open_source(hf, print).hidden_states is None
    own = open_source(vllm, print)
    checkpoint = resolve_checkpoint(str(tiny_model))
    assert own.hidden_states == JobHiddenStates(vllm, checkpoint)
    events: list[str] = []

    def features(problems):  # the vllm job's pass, less its check that vllm runs here
        events.append("features")
        return JobHiddenStates(replaced(vllm, backend="hf"), checkpoint)(problems)

    def sampler():  # the hf sampler in the vllm engine's place: vllm is not needed here
        events.append("sampler")
        return JobSampler(hf, checkpoint)()

    source = dataclasses.replace(own, sampler=sampler, hidden_states=features)
    run_oracle(vllm, source=source)
    assert events == ["features", "sampler"]
    run_oracle(vllm, source=dataclasses.replace(source, sampler=lambda: 1 / 0))  # all there

    # A finished run without them gets them without a sampler; its parts stay as they were.
    later = replaced(vllm, out=tmp_path / "later")
    run_oracle(replaced(later, store_features="none"), source=source)
    before = {f: f.read_bytes() for f in parts(later.out, "tiny")}
    run_oracle(later, source=dataclasses.replace(source, sampler=lambda: 1 / 0))
    assert {f: f.read_bytes() for f in parts(later.out, "tiny")} == before
    for job in (vllm, later):
        stored = load_prompts(job.out)
        assert stored is not None
        np.testing.assert_allclose(
            np.asarray(stored["features"].to_list()), expected, rtol=0, atol=1e-5
        )


def test_features_of_another_model_size_are_refused_not_mixed(tiny_model, tmp_path):
    """A dataset whose prompts.parquet holds features of d numbers refuses a model whose
    hidden states have another length (its prompts would get vectors of another size, which
    no estimator can use), before anything is written."""
    from transformers import AutoConfig, LlamaForCausalLM

    from basis_bench.rollouts.oracle import run_oracle

    wider = tmp_path / "wider"
    config = AutoConfig.from_pretrained(tiny_model)
    config.hidden_size = 48
    LlamaForCausalLM(config).save_pretrained(wider)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            (wider / name).write_bytes((tiny_model / name).read_bytes())
    job = job_of(
        model=str(tiny_model), policy="tiny", prompts="arithmetic:n=4,digits=1-2,steps=1-2,seed=5",
        out=tmp_path / "ds", n=1, max_new_tokens=2, device="cpu", workers=1, store_features="hidden",
    )  # fmt: skip
    run_oracle(job)
    before = (job.out / PROMPTS_FILE).read_bytes()
    more = replaced(
        job, model=str(wider), policy="wide", prompts="arithmetic:n=6,digits=1-2,steps=1-2,seed=5"
    )
    with pytest.raises(InputError, match=r"features of 32 numbers.*this model's have 48"):
        run_oracle(more)
    assert (job.out / PROMPTS_FILE).read_bytes() == before
    assert not parts(job.out, "wide")


# --------------------------------------------------------------------------- reference cache


def test_training_reference_cache_is_an_oracle_run_built_once(tmp_path):
    import numpy as np

    from basis_bench.rollouts.sampling.base import Samples
    from basis_bench.train.config import TrainConfig
    from basis_bench.train.setup import reference_cache

    class Boxed:
        """Answers 1 to everything, no model loaded."""

        def sample(self, problems, config, seed, on_progress=None):
            count = len(problems) * config.n
            return Samples(["\\boxed{1}"] * count, np.full(count, 3, np.int32), ["stop"] * count)

        def describe(self):
            return {"backend": "boxed"}

    config = made(
        TrainConfig, dict(train_prompts="arithmetic:n=20,seed=1", cache_dir=str(tmp_path), ref_n=4)
    )
    assert config.grading.answer_format == "auto"  # number for these arithmetic prompts
    prompts = config.train.load()
    rewards, features = reference_cache(config, prompts, Boxed)
    assert rewards.shape == (20, 4) and features is None  # basis: no features
    (cache,) = tmp_path.iterdir()
    assert cache.name.startswith("ref-") and len(parts(cache, "reference")) == 2  # 16 + 4 prompts
    assert (reference_cache(config, prompts, lambda: 1 / 0)[0] == rewards).all()  # reused


def test_training_reference_cache_stores_the_prompt_features_basis_context_uses(
    tiny_model, tmp_path
):
    """For an estimator that conditions on the prompt the cache also holds the model's
    prompt hidden states, read back on reuse without loading a model."""
    import numpy as np

    from basis_bench.rollouts.models import load_policy
    from basis_bench.rollouts.sampling.hf import HFSampler
    from basis_bench.train.config import TrainConfig
    from basis_bench.train.setup import reference_cache

    config = made(TrainConfig, dict(
        model=str(tiny_model), estimator="basis_context", train_prompts="arithmetic:n=6,seed=1",
        cache_dir=str(tmp_path), ref_n=2, max_new_tokens=8,
    ))  # fmt: skip
    prompts = config.train.load()
    template = config.generation.template(config.train.prompts)
    sampler = HFSampler(*load_policy(str(tiny_model), "cpu"), template)
    rewards, features = reference_cache(config, prompts, lambda: sampler)
    assert rewards.shape == (6, 2) and features is not None
    direct = sampler.prompt_hidden_states(prompts["problem"].to_list())
    np.testing.assert_allclose(features, direct, atol=1e-5)
    _, again = reference_cache(config, prompts, lambda: 1 / 0)
    np.testing.assert_array_equal(again, features)


# --------------------------------------------------------------------------- real model


@pytest.mark.slow
def test_smollm2_end_to_end_on_cpu(tmp_path):
    import numpy as np

    out = tmp_path / "smol"
    result = run_cli(
        [
            "oracle",
            "--model", "smollm2-135m",
            "--policy", "smol",
            "--prompts", "arithmetic:n=3,digits=1,steps=1,ops=+,seed=0",
            "--instruction", "Give only the final answer.",
            "--n", "4",
            "--max-new-tokens", "24",
            "--chunk-size", "2",
            "--seed", "0",
            "--device", "cpu",
            "--store-features", "hidden",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    log = " ".join(result.stderr.split())
    assert "3/3 prompts" in log and "samples/s" in log and "wrote 2 part(s), 12 rollouts" in log

    files = parts(out, "smol")
    assert [f.name for f in files] == ["part-000000.parquet", "part-000001.parquet"]
    raw = pl.concat([pl.read_parquet(f) for f in files])
    for name, dtype in {**ROLLOUT_COLUMNS, **OPTIONAL_ROLLOUT_COLUMNS}.items():
        assert raw.schema[name] == dtype, name

    df = load_rollouts(out)
    prompts = load_prompts(out)
    assert prompts is not None and prompts.height == 3
    hidden = np.asarray(prompts["features"].to_list())  # SmolLM2's final hidden states
    assert hidden.shape == (3, 576) and np.isfinite(hidden).all()
    assert np.linalg.matrix_rank(hidden) == 3
    assert df.height == 12 and set(df["policy"]) == {"smol"}
    assert set(df["prompt_id"]) == set(prompts["prompt_id"])
    per_prompt = df.group_by("prompt_id").agg(pl.col("sample_idx").sort())
    assert all(idx == [0, 1, 2, 3] for idx in per_prompt["sample_idx"].to_list())
    assert set(df["reward"]) <= {0.0, 1.0}
    assert ((df["reward"] == 1.0) == (df["verify_status"] == "correct")).all()
    assert df["reward"].sum() >= 1, df.select("response", "verify_status")
    assert df["n_tokens"].max() <= 24
    assert set(df["finish_reason"]) <= {"stop", "length"}

    meta = read_metadata(files[0])
    assert meta["simulated"] is False and meta["kind"] == "oracle"
    assert meta["run"]["model"]["name"] == "smollm2-135m"
    assert meta["run"]["sampling"] == {
        "n": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_new_tokens": 24,
    }
    assert meta["run"]["reward"]["answer_format"] == "number"
    assert meta["run"]["seed"] == 0 and meta["dataset"]["source"].startswith("arithmetic:")
    assert meta["backend"]["backend"] == "hf" and meta["package_version"]
    assert json.loads(json.dumps(meta)) == meta


def _vllm_imports() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a torch extension built for another torch
        return False
    return True


@pytest.mark.skipif(_vllm_imports(), reason="vllm imports here: auto chooses it first")
def test_auto_backend_samples_with_a_preferred_backend_that_serves_the_device(tiny_model, tmp_path):
    """--backend auto (the default) takes a registered preferred backend that serves the
    device, and every part's metadata names it; without one (vllm absent here) it is hf.
    The test backend is the hf sampler under another name, so the rows are hf's."""
    from basis_bench.rollouts.oracle import run_oracle
    from basis_bench.rollouts.sampling import register_sampler, registry
    from basis_bench.rollouts.sampling.hf import HFSampler

    class Preferred(HFSampler):
        backend = "preferred"
        preferred = True
        capabilities = dataclasses.replace(HFSampler.capabilities, cpu_workers=False)

    job = job_of(
        model=str(tiny_model), policy="tiny", prompts="arithmetic:n=4,seed=2", n=2,
        max_new_tokens=8, chunk_size=2, device="cpu", workers=1, out=tmp_path / "hf",
    )  # fmt: skip
    assert job.generation.backend == "auto"
    run_oracle(job)
    with registry.SAMPLERS.temporary():
        register_sampler(Preferred)
        run_oracle(replaced(job, out=tmp_path / "preferred"))

    def backends(out: Path) -> set[str]:
        return {
            read_metadata(p)["backend"]["backend"] for p in (out / "rollouts").rglob("*.parquet")
        }

    assert backends(tmp_path / "hf") == {"hf"}
    assert backends(tmp_path / "preferred") == {"preferred"}
    assert load_rollouts(tmp_path / "preferred").equals(load_rollouts(tmp_path / "hf"))


def test_auto_backend_falls_back_to_hf_where_the_preferred_engine_does_not_start(
    tiny_model, tmp_path
):
    """A preferred backend that serves the device but whose engine fails at start (vllm
    imported, its LLM raised): --backend auto samples with hf after one warning, the parts
    record hf; the backend named explicitly is refused with the engine's one line."""
    from basis_bench.rollouts.oracle import run_oracle
    from basis_bench.rollouts.sampling import register_sampler, registry
    from basis_bench.rollouts.sampling.base import EngineFailed
    from basis_bench.rollouts.sampling.hf import HFSampler

    class Broken(HFSampler):
        backend = "broken"
        preferred = True
        capabilities = dataclasses.replace(HFSampler.capabilities, cpu_workers=False)

        @classmethod
        def start(cls, *args, **kwargs):
            raise EngineFailed("the broken engine did not start (no device memory)")

    job = job_of(
        model=str(tiny_model), policy="tiny", prompts="arithmetic:n=4,seed=2", n=2,
        max_new_tokens=8, chunk_size=2, device="cpu", workers=1, out=tmp_path / "auto",
    )  # fmt: skip
    with registry.SAMPLERS.temporary():
        register_sampler(Broken)
        with pytest.warns(registry.BackendFallback) as said:
            run_oracle(job)
        with pytest.raises(EngineFailed, match="broken engine did not start"):
            run_oracle(replaced(job, backend="broken", out=tmp_path / "named"))
    assert str(said[-1].message) == (  # after the line on vllm, where it does not import
        "backend auto samples with hf: the broken engine did not start (no device memory)"
    )
    assert {read_metadata(p)["backend"]["backend"] for p in parts(tmp_path / "auto", "tiny")} == {
        "hf"
    }
    assert not (tmp_path / "named").exists()


@pytest.mark.skipif(_vllm_imports(), reason="vllm imports here: auto chooses it")
def test_auto_backend_says_in_one_line_why_it_samples_with_hf(tiny_model, tmp_path):
    """vllm not importable: the default --backend auto samples with hf and says so in one
    warning line (it did so in silence); --backend vllm is one error line."""
    auto = run_cli(tiny_args(tiny_model, tmp_path / "auto", "--n", "1"))
    assert auto.returncode == 0, auto.stderr
    printed = " ".join(auto.stderr.split())  # the console wraps long lines
    assert printed.count("warning:") == 1 and "Traceback" not in printed, printed
    said = printed[printed.index("warning:") :]
    assert said.startswith("warning: backend auto samples with hf: --backend vllm needs vllm")
    assert "does not import here (No module named 'vllm')" in said
    named = run_cli(tiny_args(tiny_model, tmp_path / "named", "--backend", "vllm"))
    assert_one_line_error(named, "--backend vllm needs vllm, which does not import here")
    assert not (tmp_path / "named").exists()


# --------------------------------------------------------------------------- score sketches


def test_store_scores_writes_one_sketch_a_rollout_named_in_the_metadata(tiny_model, tmp_path):
    """--store-scores K: a K-wide score_sketch column, finite, the run identity naming K, the
    seed and the parameters (a resumed run with another K is refused); a sketch is the
    sampled tokens' own, so the same seed twice gives the same sketches."""
    from basis_bench.rollouts.score_sketch import SKETCH_COLUMN

    runner = CliRunner()
    done = runner.invoke(app, tiny_args(tiny_model, tmp_path / "o", "--store-scores", "8"))
    assert done.exit_code == 0, done.output
    files = parts(tmp_path / "o", "tiny")
    df = pl.concat(pl.read_parquet(f) for f in files)
    sketch = np.stack(df[SKETCH_COLUMN].to_numpy()).astype(float)
    assert sketch.shape == (18, 8) and np.isfinite(sketch).all() and np.abs(sketch).max() > 0
    entry = read_metadata(files[0])["run"]["score_sketch"]
    assert entry["k"] == 8 and entry["seed"] == 0 and "output layer" in entry["parameters"]
    again = runner.invoke(app, tiny_args(tiny_model, tmp_path / "p", "--store-scores", "8"))
    assert again.exit_code == 0, again.output
    other = pl.concat(pl.read_parquet(f) for f in parts(tmp_path / "p", "tiny"))
    np.testing.assert_array_equal(np.stack(other[SKETCH_COLUMN].to_numpy()), sketch)
    clash = runner.invoke(app, tiny_args(tiny_model, tmp_path / "o", "--store-scores", "16"))
    assert isinstance(clash.exception, InputError) and "score_sketch" in str(clash.exception)


def test_store_scores_with_a_backend_that_cannot_score_is_refused_before_a_model_loads(
    tmp_path, monkeypatch
):
    """A backend without score_sketches (vllm's engine gives no hidden states) is refused
    by name before anything loads or is written, not after its first part."""
    from basis_bench.rollouts import oracle
    from basis_bench.rollouts.sampling.hf import HFSampler

    class Engine(HFSampler):
        backend = "vllm"
        score_sketches = oracle.Sampler.score_sketches  # the base's: cannot

    monkeypatch.setattr(oracle, "sampler_class", lambda backend, device: Engine)
    job = made(OracleJob, {"model": "smollm2-135m", "policy": "p", "prompts": "arithmetic:n=2",
                           "n": 2, "out": tmp_path / "o", "store_scores": 8})  # fmt: skip
    with pytest.raises(InputError, match="vllm backend cannot sketch scores"):
        oracle.run_oracle(job)
    assert not (tmp_path / "o").exists()
