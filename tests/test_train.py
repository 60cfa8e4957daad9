"""The training loop: losses against hand computations, configuration, and short real CPU
runs of SmolLM2 (parameters move, logs and checkpoints are written, resume continues the
step count, the estimator sees exactly its batch, the seed fixes the first rollouts)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from basis_bench.errors import InputError
from basis_bench.estimators import ESTIMATORS, EstimatorInput, grpo, register_estimator
from basis_bench.train import losses
from basis_bench.train.loop import (
    make_config,
    normalise_advantages,
    parse_override,
    read_config_file,
    read_log,
    resume_config,
    step_prompt_indices,
    train,
)

# ---------------------------------------------------------------- losses, by hand

# Two responses: 2 tokens and 1 token; the third column is padding (garbage on purpose).
LOGP = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -math.inf, -math.inf]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([2.0, -1.0])


def test_reduce_token_and_sequence_means_ignore_padding():
    values = torch.tensor([[1.0, 3.0, float("nan")], [5.0, math.inf, 0.0]])
    assert losses.reduce(values, MASK, "token_mean").item() == pytest.approx((1 + 3 + 5) / 3)
    assert losses.reduce(values, MASK, "seq_mean").item() == pytest.approx((2 + 5) / 2)
    assert losses.reduce(values, MASK, "token_mean", denom=9.0).item() == pytest.approx(1.0)


def test_gpg_loss_is_minus_advantage_weighted_logprob():
    token = losses.gpg_loss(LOGP, ADV, MASK, "token_mean")
    assert token.item() == pytest.approx(-(2 * -1 + 2 * -2 + -1 * -0.5) / 3)
    seq = losses.gpg_loss(LOGP, ADV, MASK, "seq_mean")
    assert seq.item() == pytest.approx(-((2 * -1 + 2 * -2) / 2 + (-1 * -0.5)) / 2)


def test_grpo_loss_clips_per_token_ratio():
    old = LOGP.clone()
    logp = LOGP.clone()
    logp[0, 0] += math.log(1.5)  # A > 0, ratio 1.5 -> clipped to 1.2
    logp[0, 1] += math.log(0.9)  # A > 0, ratio 0.9 -> inside the range, kept
    logp[1, 0] += math.log(0.5)  # A < 0, ratio 0.5 -> min(0.5 A, 0.8 A) = 0.8 A
    logp.requires_grad_(True)
    loss = losses.grpo_loss(logp, old, ADV, MASK, 0.2, 0.2, "token_mean")
    assert loss.item() == pytest.approx(-(1.2 * 2 + 0.9 * 2 + 0.8 * -1) / 3)
    loss.backward()
    # Clipped tokens get no gradient; the kept one gets -A * ratio / D.
    assert logp.grad[0, 0].item() == 0.0 and logp.grad[1, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-2 * 0.9 / 3)
    assert torch.isfinite(logp.grad).all()


def test_ratio_losses_at_ratio_one_have_the_policy_gradient():
    logp = LOGP.clone().requires_grad_(True)
    old = LOGP.detach()
    for agg in ("token_mean", "seq_mean"):
        (g_pg,) = torch.autograd.grad(losses.gpg_loss(logp, ADV, MASK, agg), logp)
        (g_ppo,) = torch.autograd.grad(losses.grpo_loss(logp, old, ADV, MASK, 0.2, 0.2, agg), logp)
        assert torch.allclose(g_pg * MASK, g_ppo * MASK)
    (g_seq,) = torch.autograd.grad(losses.gpg_loss(logp, ADV, MASK, "seq_mean"), logp)
    (g_gspo,) = torch.autograd.grad(losses.gspo_loss(logp, old, ADV, MASK), logp)
    assert torch.allclose(g_seq * MASK, g_gspo * MASK)


def test_gspo_uses_the_geometric_mean_ratio_of_the_sequence():
    old = LOGP.detach().clone()
    logp = LOGP.detach().clone()
    logp[0, 0] += 0.3
    logp[0, 1] -= 0.1  # sequence 0: s = exp((0.3 - 0.1) / 2) = exp(0.1)
    logp[1, 0] -= 0.0002  # sequence 1: s = exp(-0.0002), inside [1 - 3e-4, 1 + 4e-4]
    s0, s1 = math.exp(0.1), math.exp(-0.0002)
    expected = -(min(s0 * 2, min(s0, 1 + 4e-4) * 2) + (s1 * -1)) / 2
    assert losses.gspo_loss(logp, old, ADV, MASK).item() == pytest.approx(expected)


def test_kl_k3_by_hand_zero_at_equality_and_never_negative():
    ref = LOGP.detach().clone()
    assert losses.kl_k3(LOGP, ref, MASK).item() == pytest.approx(0.0)
    ref[0, 0] += 0.5
    ref[1, 0] -= 1.0
    expected = ((math.exp(0.5) - 0.5 - 1) + 0 + (math.exp(-1) + 1 - 1)) / 3
    assert losses.kl_k3(LOGP, ref, MASK).item() == pytest.approx(expected)
    rng = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, 7, generator=rng), torch.randn(50, 7, generator=rng)
    assert losses.kl_k3(a, b, torch.ones(50, 7)).item() > 0


# ---------------------------------------------------------------- loop pieces, no model


def test_prompts_cover_each_epoch_once_and_resume_needs_no_replay():
    steps = [step_prompt_indices(10, 4, t, seed=3) for t in range(1, 6)]
    flat = np.concatenate(steps)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert not np.array_equal(flat[:10], flat[10:20]), "each epoch is a fresh permutation"
    assert np.array_equal(step_prompt_indices(10, 4, 4, seed=3), steps[3])


def test_advantage_normalisations():
    rewards = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    adv = rewards - rewards.mean(axis=1, keepdims=True)
    group = normalise_advantages(adv, rewards, "group_std")
    assert np.allclose(group, adv / (rewards.std(axis=1, ddof=1, keepdims=True) + 1e-6))
    white = normalise_advantages(adv + 0.3, rewards, "batch_whiten")
    assert abs(white.mean()) < 1e-9 and white.std() == pytest.approx(1.0, abs=1e-5)
    scaled = normalise_advantages(adv + 0.3, rewards, "batch_std")
    assert np.allclose(scaled * (adv + 0.3).std(), adv + 0.3, atol=1e-5)
    with pytest.raises(InputError, match="G >= 2"):
        normalise_advantages(adv[:, :1], rewards[:, :1], "group_std")


def test_config_files_overrides_and_errors(tmp_path):
    (tmp_path / "base.toml").write_text('steps = 7\nloss = "grpo"\nlr = 1\n')
    (tmp_path / "run.toml").write_text('extends = "base.toml"\nsteps = 9\n')
    values = read_config_file(tmp_path / "run.toml")
    config = make_config(values, ["estimator=rloo", "estimator_options.x=2", "clip_high=0.28"])
    assert (config.steps, config.loss, config.lr, config.estimator) == (9, "grpo", 1.0, "rloo")
    assert config.estimator_options == {"x": 2} and config.clip_high == 0.28
    assert parse_override('instruction="a = b"') == ("instruction", "a = b")
    with pytest.raises(InputError, match="unknown config key"):
        make_config({"stepz": 3})
    with pytest.raises(InputError, match="must be int"):
        make_config({}, ["steps=many"])
    with pytest.raises(InputError, match="loss must be one of"):
        make_config({}, ["loss=ppo"])
    bad = make_config({}, ["estimator=grpo", "group_size=8", "rollouts_per_step=12"])
    with pytest.raises(InputError, match="not a multiple"):
        train(bad)
    with pytest.raises(InputError, match="unknown estimator"):
        train(make_config({}, ["estimator=nope"]))


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
    register_estimator("test_train_recording")(_recording)
    register_estimator("test_train_recording_group", group=True)(_recording_group)
    yield
    for name in ("test_train_recording", "test_train_recording_group"):
        ESTIMATORS.pop(name, None)


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M as a plain HF directory: dequantized once, then each run loads it in <1 s."""
    from basis_bench.rollouts.models import load_policy
    from basis_bench.train.loop import trainable

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
        "eval_prompts": "arithmetic:n=4,digits=1,steps=1,ops=+,seed=1",
        "instruction": "Answer with the number only.",
        "answer_format": "number",
        "rollouts_per_step": 4,
        "ref_samples": 4,
        "max_new_tokens": 8,
        "steps": 2,
        "eval_every": 2,
        "checkpoint_every": 1,
        "lr": 1e-4,
        "seed": 0,
    }
    return make_config(base, list(overrides))


def rollouts(run_dir: Path, step: int) -> pl.DataFrame:
    return pl.read_parquet(run_dir / "rollouts" / f"train-{step:06d}.parquet")


@pytest.fixture(scope="module")
def basis_run(smol_dir, tmp_path_factory) -> Path:
    return train(tiny(smol_dir, tmp_path_factory.mktemp("a"), "estimator=basis"))


@pytest.mark.slow
def test_token_logprobs_mask_prompt_and_padding_and_sampling_follows_the_seed(smol_dir):
    from basis_bench.rollouts.models import load_policy
    from basis_bench.rollouts.prompts import PromptTemplate
    from basis_bench.rollouts.sampling import SamplingConfig
    from basis_bench.rollouts.sampling.hf import HFSampler
    from basis_bench.train.loop import sample_rollouts, token_logprobs

    torch.set_num_threads(1)
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
    a, b, c = (sample_rollouts(sampler, ["What is 2 + 3?"], config, s) for s in (11, 11, 12))
    assert [r.tolist() for r in a.response_tokens] == [r.tolist() for r in b.response_tokens]
    assert a.responses != c.responses
    assert a.responses == tok.batch_decode(a.response_tokens, skip_special_tokens=True)


@pytest.mark.slow
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
    assert resolve_checkpoint(ckpt).gguf_file is None  # what `oracle --ckpt DIR` resolves
    trained, _ = load_policy(ckpt, device="cpu")
    base, _ = load_policy(smol_dir, device="cpu")
    pairs = zip(trained.parameters(), base.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)
    assert (basis_run / "eval" / "greedy-000002.parquet").is_file()


@pytest.mark.slow
def test_resume_continues_the_step_count_and_reproduces_the_run(basis_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(basis_run, copy)
    resume = copy / "checkpoints" / "step-000001"
    config = resume_config(resume, ["eval_every=0", "checkpoint_every=0"])
    assert config.run_dir == str(copy.resolve()) and config.steps == 2
    train(config, resume=resume)
    assert [r["step"] for r in read_log(copy)] == [0, 1, 2]
    # Step 2 again, from step 1's weights and the same seed: the same rollouts and update.
    again, first = read_log(copy)[2], read_log(basis_run)[2]
    assert rollouts(copy, 2)["response"].to_list() == rollouts(basis_run, 2)["response"].to_list()
    assert again["loss"] == pytest.approx(first["loss"], rel=1e-4, abs=1e-7)
    assert again["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-3, abs=1e-7)


@pytest.mark.slow
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
        "eval_every=0",
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


@pytest.mark.slow
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
        "eval_every=0",
    )
    step = rollouts(train(config), 1)
    assert len(RECORDED) == 1 and RECORDED[0].shape == (2, 2), "4 rollouts = 2 prompts x G=2"
    assert np.array_equal(RECORDED[0].reshape(-1), step["reward"].to_numpy())
    ids = step["prompt_id"].to_list()
    assert ids[0] == ids[1] != ids[2] == ids[3]


def test_train_figures_from_logs(tmp_path):
    import json

    from basis_bench.train.figures import plot_training
    from basis_bench.train.loop import append_jsonl

    for name, estimator, betas in (("b", "basis", [math.inf, 2.0, 0.5]), ("g", "grpo", None)):
        run = tmp_path / name
        run.mkdir()
        config = {"estimator": estimator, "group_size": 8, "loss": "gpg"}
        (run / "config.json").write_text(json.dumps(config))
        append_jsonl(run / "log.jsonl", {"step": 0, "eval_accuracy": 0.25})
        for t in (1, 2, 3):
            beta = betas[t - 1] if betas else None
            record = {"step": t, "mean_reward": 0.1 * t, "beta": beta}
            append_jsonl(run / "log.jsonl", record | ({"eval_accuracy": 0.5} if t == 3 else {}))
    assert '"beta": "inf"' in (tmp_path / "b" / "log.jsonl").read_text()
    written = plot_training([tmp_path / "b", tmp_path / "g"], tmp_path / "figs", smooth=2)
    assert {p.name for p in written} == {"learning_curves.png", "beta.png", "training_summary.csv"}
    table = pl.read_csv(tmp_path / "figs" / "training_summary.csv")
    assert table.filter(pl.col("label") == "GRPO (G=8)")[
        "eval_accuracy"
    ].drop_nulls().to_list() == [0.25, 0.5]
    assert table.filter(pl.col("label") == "BASIS")["beta"].drop_nulls().to_list() == [
        math.inf,
        2.0,
        0.5,
    ]


def test_shipped_experiment_configs_are_valid_and_share_the_budget():
    from basis_bench.estimators import get

    root = Path(__file__).resolve().parent.parent / "experiments"
    configs = {p: make_config(read_config_file(p)) for p in sorted(root.rglob("*.toml"))}
    assert len(configs) >= 18
    for path, config in configs.items():
        estimator = get(config.estimator)
        assert config.rollouts_per_step % estimator.rollouts_per_prompt(config.group_size) == 0, (
            path
        )
    for setting in ("cpu_compare", "qwen3_4b_dapo"):
        budgets = {c.rollouts_per_step for p, c in configs.items() if p.parent.name == setting}
        assert len(budgets) == 1, f"{setting}: every run samples the same rollouts per step"
    compare = [c for p, c in configs.items() if p.parent.name == "cpu_compare"]
    assert len({c.steps for c in compare}) == 1
