"""Short real CPU runs of SmolLM2 through `train` (marked slow): parameters move, logs and
checkpoints are written, resume continues the step count and reproduces the run, the
estimator sees exactly its batch, the seed fixes the first rollouts, final_line grading
gives cut responses nothing."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import import_extra

from basis_bench.estimators import ESTIMATORS, EstimatorInput, grpo, register_estimator
from basis_bench.train import make_config, read_log, resume_config, train
from basis_bench.train.policy_measures import answer_diversity

# every test here needs torch: without the [hf] extra the module is skipped, naming it
torch = import_extra("hf", "torch")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


# ---------------------------------------------------------------- short real runs

RECORDED: list[np.ndarray] = []


def _recording(batch: EstimatorInput) -> np.ndarray:
    """The batch mean (REINFORCE++), recording the rewards it was given."""
    RECORDED.append(np.array(batch.rewards, copy=True))
    return np.broadcast_to(batch.rewards.mean(), batch.rewards.shape)


def _recording_group(batch: EstimatorInput) -> np.ndarray:
    """GRPO's group mean, recording the rewards it was given."""
    RECORDED.append(np.array(batch.rewards, copy=True))
    return grpo(batch.rewards)


@pytest.fixture(scope="module", autouse=True)
def recording_estimators():
    """Register the recording estimators for this module only: pytest imports every test
    module before running any, so a registration at import time would leak into the
    registry-wide tests of other modules."""
    with ESTIMATORS.temporary():
        register_estimator("test_train_recording")(_recording)
        register_estimator("test_train_recording_group", group=True)(_recording_group)
        yield


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M as a plain HF directory: dequantized once, then each run loads it in <1 s."""
    from basis_bench.rollouts.models import load_policy
    from basis_bench.train.setup import trainable

    path = tmp_path_factory.mktemp("smol")
    model, tokenizer = load_policy("smollm2-135m", device="cpu")
    trainable(model).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def tiny(smol_dir: Path, root: Path, *overrides: str):
    """A few-second configuration: 8 training prompts, 4 rollouts/step, 8 new tokens."""
    base = {
        "model": str(smol_dir),
        "device": "cpu",
        "cpu_threads": 1,
        "run_dir": str(root / "run"),
        "cache_dir": str(root / "cache"),
        "train_prompts": "arithmetic:n=8,digits=1,steps=1,ops=+,seed=0",
        "heldout_prompts": "arithmetic:n=4,digits=1,steps=1,ops=+,seed=1",
        "instruction": "Answer with the number only.",
        "answer_format": "number",
        "rollouts_per_step": 4,
        "ref_n": 4,
        "max_new_tokens": 8,
        "steps": 2,
        "heldout_every": 2,
        "checkpoint_every": 1,
        "lr": 1e-4,
        "seed": 2,
    }
    return make_config(base, list(overrides))


def rollouts(run_dir: Path, step: int) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "rollouts" / f"train-{step:06d}.parquet")


@pytest.fixture(scope="module")
def basis_run(smol_dir, tmp_path_factory) -> Path:
    return train(tiny(smol_dir, tmp_path_factory.mktemp("a"), "estimator=basis"))


def test_token_logprobs_mask_prompt_and_padding_and_sampling_follows_the_seed(smol_dir):
    from basis_bench.rollouts.models import load_policy
    from basis_bench.rollouts.sampling import SamplingConfig
    from basis_bench.rollouts.sampling.hf import HFSampler
    from basis_bench.rollouts.templates import PromptTemplate
    from basis_bench.train.sample import sample_rollouts
    from basis_bench.train.update import token_logprobs

    model, tok = load_policy(smol_dir, device="cpu")
    prompts = [[1, 504, 2111, 314], [1, 27]]
    responses = [np.array([253, 1097, 2]), np.array([30, 31, 32, 33, 34])]
    logp, mask = token_logprobs(model, prompts, responses, tok.pad_token_id, temperature=0.7)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids = torch.tensor([p + r.tolist()])
        with torch.no_grad():
            alone = torch.log_softmax(model(ids).logits[0].float() / 0.7, -1)
        expected = alone[len(p) - 1 : -1].gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        assert torch.allclose(logp[i, : len(r)], expected, atol=1e-4)

    sampler = HFSampler(model, tok, PromptTemplate())
    config = SamplingConfig(n=2, max_new_tokens=6)
    prompts = pl.DataFrame({"problem": ["What is 2 + 3?"]})
    a, b, c = (sample_rollouts(sampler, prompts, config, s) for s in (11, 11, 12))
    assert [r.tolist() for r in a.response_tokens] == [r.tolist() for r in b.response_tokens]
    assert a.responses != c.responses
    assert a.responses == tok.batch_decode(a.response_tokens, skip_special_tokens=True)


def test_run_moves_parameters_logs_and_writes_loadable_checkpoints(basis_run, smol_dir):
    from basis_bench.rollouts.models import load_policy, resolve_checkpoint

    log = read_log(basis_run)
    assert [r["step"] for r in log] == [0, 1, 2]
    assert "eval_accuracy" in log[0] and "eval_accuracy" in log[2]
    for key in ("mean_reward", "beta", "adv_mean", "adv_std", "zero_adv_share", "response_tokens"):
        assert key in log[1]
    assert set(log[1]["seconds"]) >= {"sample", "reward", "estimate", "update"}
    assert log[1]["beta"] is not None, "BASIS reports its calibrated beta"
    assert log[1]["adv_std"] > 0, "the seed was chosen so that step 1 has something to learn"
    ckpt = basis_run / "checkpoints" / "step-000001"
    assert resolve_checkpoint(ckpt).gguf_file is None  # what `oracle --model DIR` resolves
    trained, _ = load_policy(ckpt, device="cpu")
    base, _ = load_policy(smol_dir, device="cpu")
    pairs = zip(trained.parameters(), base.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)
    greedy = pl.read_parquet(basis_run / "eval" / "greedy-000002.parquet")
    assert log[2]["eval_accuracy"] == greedy["reward"].mean()
    assert log[2]["eval_truncated_share"] == (greedy["finish_reason"] == "length").mean()
    assert log[2]["eval_answer_diversity"] == answer_diversity(greedy["response"].to_list())
    assert 0 < log[1]["entropy"] < math.log(trained.config.vocab_size)  # nats
    recorded = json.loads((basis_run / "config.json").read_text())
    assert recorded["estimator"] == "basis" and recorded["steps"] == 2
    assert {"git_commit", "date_utc", "versions", "argv"} <= set(recorded["provenance"])


def test_final_line_grading_gives_cut_responses_nothing_in_training_and_evaluation(
    smol_dir, tmp_path
):
    config = tiny(smol_dir, tmp_path, "answer_format=final_line", "steps=1", "heldout_every=1")
    run_dir = train(config)
    sampled = pl.concat([rollouts(run_dir, 1), pl.read_parquet(run_dir / "eval" / "*.parquet")])
    cut = sampled.filter(pl.col("finish_reason") == "length")
    assert cut.height > 0, "8 new tokens: some responses run long"
    assert cut["reward"].sum() == 0 and set(cut["verify_status"]) == {"truncated"}
    log = read_log(run_dir)
    assert [r["eval_accuracy"] for r in log] == [r["eval_strict_accuracy"] for r in log]


def test_resume_continues_the_step_count_and_reproduces_the_run(basis_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(basis_run, copy)
    resume = copy / "checkpoints" / "step-000001"
    config = resume_config(resume, ["heldout_every=0", "checkpoint_every=0"])
    assert config.run_dir == str(copy.resolve()) and config.steps == 2
    train(config, resume=resume)
    assert [r["step"] for r in read_log(copy)] == [0, 1, 2]
    # Step 2 again, from step 1's weights and the same seed: the same rollouts and update.
    again, first = read_log(copy)[2], read_log(basis_run)[2]
    assert rollouts(copy, 2)["response"].to_list() == rollouts(basis_run, 2)["response"].to_list()
    assert again["loss"] == pytest.approx(first["loss"], rel=1e-4, abs=1e-7)
    assert again["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-3, abs=1e-7)


def test_estimator_sees_exactly_its_batch_and_same_seed_same_first_rollouts(
    basis_run, smol_dir, tmp_path
):
    RECORDED.clear()
    config = tiny(
        smol_dir,
        tmp_path,
        "estimator=test_train_recording",
        "steps=1",
        "loss=grpo",
        "minibatches=2",
        "micro_batch_size=1",
        "kl_coef=0.1",
        "checkpoint_every=0",
        "heldout_every=0",
    )
    run = train(config)
    assert len(RECORDED) == 1
    step = rollouts(run, 1)
    assert RECORDED[0].shape == (4, 1), "4 rollouts per step, one per prompt"
    assert np.array_equal(RECORDED[0].reshape(-1), step["reward"].to_numpy())
    assert not (tmp_path / "cache").exists(), "no reference cache for an estimator without one"
    kl = read_log(run)[-1]["kl"]
    assert kl is not None and kl >= 0
    # Same seed as the BASIS run: the same first prompts and responses, whatever the estimator.
    first = rollouts(basis_run, 1)
    assert step.select("prompt_id", "response").equals(first.select("prompt_id", "response"))


def test_group_estimator_gets_prompt_major_groups(smol_dir, tmp_path):
    RECORDED.clear()
    config = tiny(
        smol_dir,
        tmp_path,
        "estimator=test_train_recording_group",
        "group_size=2",
        "loss=gspo",
        "steps=1",
        "checkpoint_every=0",
        "heldout_every=0",
    )
    step = rollouts(train(config), 1)
    assert len(RECORDED) == 1 and RECORDED[0].shape == (2, 2), "4 rollouts = 2 prompts x G=2"
    assert np.array_equal(RECORDED[0].reshape(-1), step["reward"].to_numpy())
    ids = step["prompt_id"].to_list()
    assert ids[0] == ids[1] != ids[2] == ids[3]


def test_basis_context_trains_on_the_reference_models_prompt_hidden_states(smol_dir, tmp_path):
    """basis_context's features in training: SmolLM2's prompt hidden states, stored in the
    reference cache and seen by the fit (its design has more than the intercept column)."""
    from basis_bench.estimators.context import COMPONENTS
    from basis_bench.rollouts.store import load_prompts
    from basis_bench.train.checkpoint import load_trainer_state

    run = train(tiny(smol_dir, tmp_path, "estimator=basis_context", "heldout_every=0"))
    (cache,) = (tmp_path / "cache").iterdir()
    prompts = load_prompts(cache)
    assert prompts is not None and np.asarray(prompts["features"].to_list()).shape == (8, 576)
    state = load_trainer_state(run / "checkpoints" / "step-000002")["estimator_state"]
    curvature = np.asarray(state["fit_curvature"])
    assert curvature.shape == (1 + COMPONENTS, 1 + COMPONENTS)  # intercept + leading PCs


def test_seeds_runner_skips_finished_resumes_interrupted_restarts_uncheckpointed(
    smol_dir, tmp_path
):
    from basis_bench.train.seeds import train_seeds

    config = tiny(smol_dir, tmp_path, "estimator=reinforce_pp", "eval_every=0")
    states: list[tuple[str, str]] = []

    def on_run(run, state):
        states.append((Path(run.run_dir).name, state))

    zero, one = train_seeds(config, [0, 1], on_run=on_run)
    assert states == [("seed-0", "new"), ("seed-1", "new")]
    assert rollouts(zero, 1)["response"].to_list() != rollouts(one, 1)["response"].to_list()
    finished_log, first = (zero / "log.jsonl").read_bytes(), read_log(one)
    # seed 1 killed during step 2: its step-2 checkpoint and log record never written
    shutil.rmtree(one / "checkpoints" / "step-000002")
    (one / "log.jsonl").write_text((one / "log.jsonl").read_text().splitlines()[0] + "\n")
    states.clear()
    train_seeds(config, [0, 1], on_run=on_run, keep_checkpoints=1)
    assert states == [("seed-0", "finished"), ("seed-1", "resume")]
    assert (zero / "log.jsonl").read_bytes() == finished_log
    again = read_log(one)
    assert [r["step"] for r in again] == [1, 2]
    assert again[1]["loss"] == pytest.approx(first[1]["loss"], rel=1e-4, abs=1e-7)
    assert again[1]["mean_reward"] == first[1]["mean_reward"]
    assert sorted(p.name for p in (one / "checkpoints").iterdir()) == ["step-000002"]
    # seed 1 killed during step 1 of a fresh start: a log line, no complete checkpoint
    shutil.rmtree(one / "checkpoints")
    (one / "log.jsonl").write_text((one / "log.jsonl").read_text().splitlines()[0] + "\n")
    states.clear()
    train_seeds(config, [1], on_run=on_run)
    assert states == [("seed-1", "restart")]
    assert [r["step"] for r in read_log(one)] == [1, 2]
    assert read_log(one)[1]["mean_reward"] == first[1]["mean_reward"]  # the same run again


# ---------------------------------------------------------------- the value probe

PROBE = ("probe_prompts=3", "probe_samples=4")
PROBE_KEYS = ("probe_value_error", "probe_value_mse", "probe_value")


def _training_numbers(log: list[dict]) -> list[dict]:
    """A log's records without the probe's numbers and the phases' seconds."""
    return [{k: v for k, v in r.items() if k not in (*PROBE_KEYS, "seconds")} for r in log]


def test_value_probe_changes_nothing_of_training(basis_run, smol_dir, tmp_path):
    """The tracker (a stateful estimator) with and without the probe at every step: the
    same rollouts, log numbers, weights, optimizer and RNG state; only the probe's records
    (steps 0, 1, 2) are added."""
    from safetensors.torch import load_file

    from basis_bench.train.checkpoint import load_trainer_state

    runs = {}
    for name, probe in (("off", ()), ("on", ("probe_every=1", *PROBE))):
        settings = ("estimator=basis_track", f"cache_dir={basis_run.parent / 'cache'}", *probe)
        runs[name] = train(tiny(smol_dir, tmp_path / name, *settings))
    off, on = runs["off"], runs["on"]
    for step in (1, 2):
        assert rollouts(on, step).equals(rollouts(off, step))
    assert _training_numbers(read_log(on)) == _training_numbers(read_log(off))
    for record in read_log(on):
        assert all(isinstance(record[k], float) for k in PROBE_KEYS)
        assert 0 <= record["probe_value"] <= 1 and "probe" in record["seconds"]
        assert record["probe_value_mse"] >= record["probe_value_error"]
    assert not any(k in r for r in read_log(off) for k in PROBE_KEYS)
    for step in (1, 2):
        ckpt = {n: run / "checkpoints" / f"step-{step:06d}" for n, run in runs.items()}
        weights = {n: load_file(c / "model.safetensors") for n, c in ckpt.items()}
        assert all(torch.equal(weights["on"][k], weights["off"][k]) for k in weights["off"])
        state = {n: load_trainer_state(c) for n, c in ckpt.items()}
        assert torch.equal(state["on"]["rng"]["torch"], state["off"]["rng"]["torch"])
        assert state["on"]["estimator_state"] == state["off"]["estimator_state"]
        moments = [s["optimizer"]["state"][0]["exp_avg"] for s in state.values()]
        assert torch.equal(*moments)


def test_resume_with_the_probe_turned_on_adds_its_records_from_then_on(basis_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(basis_run, copy)
    resume = copy / "checkpoints" / "step-000001"
    train(resume_config(resume, ["probe_every=1", *PROBE]), resume=resume)
    log = read_log(copy)
    assert [all(k in r for k in PROBE_KEYS) for r in log] == [False, False, True]
    assert rollouts(copy, 2)["response"].to_list() == rollouts(basis_run, 2)["response"].to_list()
    assert log[2]["loss"] == pytest.approx(read_log(basis_run)[2]["loss"], rel=1e-4, abs=1e-7)
    assert json.loads((copy / "config.json").read_text())["probe_every"] == 1
