"""A reference cache from the trainer's own data and reward (issue 45 item 1): ``--prompts
trainer:PATH`` renders each prompt as TRL and verl render it, ``--reward module:function`` scores
with TRL's reward signature, and the plug-ins refuse training data the cache does not hold,
showing the text beside the nearest cached prompt, before a model loads."""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from conftest import assert_one_line_error, import_extra, run_main

from basis_bench.errors import InputError
from basis_bench.guards.outputs import write_parquet_atomic
from basis_bench.integrations.keys import basis_from_rollouts, cached_prompts, prompt_key
from basis_bench.integrations.prompt_check import check_parquet_prompts
from basis_bench.rollouts.models import load_tokenizer, resolve_checkpoint
from basis_bench.rollouts.prompts import load_prompt_source
from basis_bench.rollouts.reward_function import load_reward_function
from basis_bench.rollouts.rewards import RewardConfig
from basis_bench.rollouts.sampling.base import Sampler
from basis_bench.rollouts.scoring import grade
from basis_bench.rollouts.store import load_prompts, load_rollouts
from basis_bench.rollouts.templates import DEFAULT_TEMPLATE
from basis_bench.rollouts.trainer_prompts import model_inputs
from basis_bench.schema import PROMPTS_FILE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SYSTEM = "Answer with one number."


def chat(i: int, system: str | None = SYSTEM) -> list[dict[str, str]]:
    user = [{"role": "user", "content": f"What is {i} + {i}?"}]
    return ([{"role": "system", "content": system}] if system else []) + user


def trl_rows(n: int = 3, system: str | None = SYSTEM) -> list[dict]:
    """A TRL-style dataset: chat prompts and the columns its reward functions read."""
    return [{"prompt": chat(i, system), "answer": str(2 * i), "level": i} for i in range(n)]


REWARDS = textwrap.dedent(
    """
    CALLS = []

    def short(prompts, completions, answer, level, completion_ids, **kwargs):
        CALLS.append(dict(prompts=prompts, completions=completions, answer=answer, level=level,
                          completion_ids=completion_ids, rest=sorted(kwargs)))
        return [float(len(c[0]["content"]) % 3) + lv for c, lv in zip(completions, level)]

    def unit(prompts, completions, level, **kwargs):
        return [(len(c[0]["content"]) % 2 + lv % 2) / 2 for c, lv in zip(completions, level)]

    def nothing(prompts, completions, **kwargs):
        return [None] * len(prompts)

    def one(prompts, completions, **kwargs):
        return [1.0]
    """
)


@pytest.fixture
def rewards_file(tmp_path: Path) -> Path:
    path = tmp_path / "trl_rewards.py"
    path.write_text(REWARDS)
    return path


@pytest.fixture(scope="module")
def smol_tokenizer():
    return load_tokenizer(resolve_checkpoint("smollm2-135m"))


# --------------------------------------------------------------------------- the source


def test_a_trainer_dataset_reads_alike_from_a_folder_parquet_and_jsonl(tmp_path: Path) -> None:
    rows = trl_rows()
    pl.DataFrame(rows).write_parquet(tmp_path / "train.parquet")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    frames = [
        load_prompt_source(f"trainer:{tmp_path / f}") for f in ("train.parquet", "train.jsonl")
    ]
    datasets = import_extra("datasets")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    frames.append(load_prompt_source(f"trainer:{tmp_path / 'ds'}"))
    for frame in frames:
        assert frame.select("problem", "answer", "trainer_prompt", "trainer_row").equals(
            frames[0].select("problem", "answer", "trainer_prompt", "trainer_row")
        )
    first = frames[0].row(0, named=True)
    assert first["problem"] == "What is 0 + 0?"  # the key text: the last user message
    assert json.loads(first["trainer_prompt"]) == chat(0)  # the whole conversation
    assert json.loads(first["trainer_row"]) == {"answer": "0", "level": 0}


def test_a_verl_parquet_gives_its_ground_truth_and_a_shared_user_message_is_refused(
    tmp_path: Path,
) -> None:
    verl = [
        {
            "data_source": "gsm8k",
            "prompt": chat(i, None),
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }
        for i in range(2)
    ]
    pl.DataFrame(verl).write_parquet(tmp_path / "verl.parquet")
    frame = load_prompt_source(f"trainer:{tmp_path / 'verl.parquet'}")
    assert frame["answer"].to_list() == ["0", "2"]
    clash = [*trl_rows(1), {"prompt": chat(0, "Be brief."), "answer": "0", "level": 0}]
    pl.DataFrame(clash).write_parquet(tmp_path / "clash.parquet")
    with pytest.raises(InputError, match="user message of an earlier row"):
        load_prompt_source(f"trainer:{tmp_path / 'clash.parquet'}")
    pl.DataFrame({"question": ["x"]}).write_parquet(tmp_path / "none.parquet")
    with pytest.raises(InputError, match="needs a 'prompt' column"):
        load_prompt_source(f"trainer:{tmp_path / 'none.parquet'}")


def test_trainer_prompts_are_the_token_ids_trl_generates_from(smol_tokenizer, tmp_path) -> None:
    """TRL's own ``_tokenize_prompts`` (bound to what it reads of the trainer) against the
    sampler's ids: a chat with its system prompt, and a plain-text prompt."""
    try:
        from trl import GRPOTrainer
    except Exception as exc:
        pytest.skip(f"trl does not import here: {type(exc).__name__}: {exc}")
    trl_self = SimpleNamespace(
        processing_class=smol_tokenizer,
        chat_template=None,
        tools=None,
        chat_template_kwargs={},
        environment_factories=None,
        _is_vlm=False,
    )
    sampler = SimpleNamespace(tokenizer=smol_tokenizer, template=DEFAULT_TEMPLATE)
    texts = [{"prompt": f"Question {i}: 1 + {i} =", "answer": "1"} for i in range(2)]
    for rows in (trl_rows(), texts):
        path = tmp_path / f"{len(rows)}.parquet"
        pl.DataFrame(rows).write_parquet(path)
        inputs = model_inputs(load_prompt_source(f"trainer:{path}"))
        ours = Sampler.prompt_token_ids(sampler, inputs)  # type: ignore[arg-type]
        theirs = GRPOTrainer._tokenize_prompts(trl_self, [r["prompt"] for r in rows])[0]
        assert ours == [list(t) for t in theirs]
        if rows is not texts:  # the dataset's system prompt, not the template's default
            assert SYSTEM in smol_tokenizer.decode(ours[0])


# --------------------------------------------------------------------------- the reward


def test_a_reward_function_is_called_with_trl_arguments(rewards_file: Path, tmp_path) -> None:
    pl.DataFrame(trl_rows(2)).write_parquet(tmp_path / "train.parquet")
    prompts = load_prompt_source(f"trainer:{tmp_path / 'train.parquet'}")
    spec = f"{rewards_file}:short"
    responses = [["ab", "abcd"], ["abc", ""]]
    out = grade(
        responses,
        prompts,
        RewardConfig(function=spec),
        DEFAULT_TEMPLATE,
        None,
        [[1], [2, 3], [4], []],
    )
    np.testing.assert_array_equal(out[0][0], [2.0, 1.0])  # len % 3 + level 0
    np.testing.assert_array_equal(out[1][0], [1.0, 1.0])  # len % 3 + level 1
    assert out[0][1] == ["reward_function"] * 2
    call = load_reward_function(spec).__globals__["CALLS"][-1]
    assert call["prompts"] == [chat(0), chat(0), chat(1), chat(1)]  # one per completion
    assert call["completions"][1] == [{"role": "assistant", "content": "abcd"}]
    assert call["answer"] == ["0", "0", "2", "2"] and call["level"] == [0, 0, 1, 1]
    assert call["completion_ids"] == [[1], [2, 3], [4], []]
    assert call["rest"] == ["log_extra", "log_metric", "trainer_state"]


def test_reward_function_mistakes_are_one_line_each(rewards_file: Path, tmp_path) -> None:
    pl.DataFrame(trl_rows(1)).write_parquet(tmp_path / "train.parquet")
    prompts = load_prompt_source(f"trainer:{tmp_path / 'train.parquet'}")
    for name, needle in (("nothing", "returned None"), ("one", "1 rewards for 2")):
        config = RewardConfig(function=f"{rewards_file}:{name}")
        with pytest.raises(InputError, match=needle):
            grade([["a", "b"]], prompts, config, DEFAULT_TEMPLATE)
    for spec, needle in (
        (f"{rewards_file}:absent", "has no function 'absent'"),
        ("no_such_module_45:f", "No module named"),
        ("justaname", "module:function"),
        (f"{tmp_path / 'gone.py'}:f", "no file"),
    ):
        with pytest.raises(InputError, match=needle):
            RewardConfig(function=spec)


# --------------------------------------------------------------------------- the oracle


def test_oracle_from_a_trainer_dataset_with_a_reward_function(
    tiny_model, rewards_file, tmp_path, monkeypatch, capsys
) -> None:
    pl.DataFrame(trl_rows(3)).write_parquet(tmp_path / "train.parquet")
    out = tmp_path / "cache"
    base = [
        "oracle", "--model", str(tiny_model), "--policy", "reference",
        "--prompts", f"trainer:{tmp_path / 'train.parquet'}", "--n", "2",
        "--max-new-tokens", "6", "--device", "cpu", "--workers", "1", "--out", str(out),
    ]  # fmt: skip
    refused = run_main(monkeypatch, capsys, *base, "--system-prompt", "Be brief.")
    assert_one_line_error(refused, "holds each prompt whole", "--system-prompt")
    run = run_main(monkeypatch, capsys, *base, "--reward", f"{rewards_file}:short")
    assert run.code == 0, run.message
    df = load_rollouts(out).sort("prompt_id", "sample_idx")
    prompts = load_prompts(out)
    assert prompts is not None and prompts.height == 3 and "trainer_prompt" in prompts.columns
    level = dict(
        zip(
            prompts["prompt_id"],
            [json.loads(r)["level"] for r in prompts["trainer_row"]],
            strict=True,
        )
    )
    # each reward is the function's on the stored response: len % 3 + the row's level
    want = [len(r) % 3 + level[p] for r, p in zip(df["response"], df["prompt_id"], strict=True)]
    assert df["reward"].to_list() == want and set(df["verify_status"]) == {"reward_function"}
    # the cache keys as the plug-ins key the dataset's prompts
    cached = cached_prompts(out, "{problem}")
    assert cached.check([r["prompt"] for r in trl_rows(3)], "train") == 3


def test_math_verify_without_answers_is_refused_before_the_model_loads(
    tiny_model, tmp_path, monkeypatch, capsys
) -> None:
    pl.DataFrame({"prompt": [chat(1)], "level": [1]}).write_parquet(tmp_path / "t.parquet")
    run = run_main(
        monkeypatch, capsys, "oracle", "--model", str(tiny_model), "--policy", "p",
        "--prompts", f"trainer:{tmp_path / 't.parquet'}", "--n", "2", "--device", "cpu",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert_one_line_error(run, "1 prompt(s) have no answer for math-verify", "--reward")
    assert not (tmp_path / "o").exists()  # refused before the output folder, or any model


@pytest.mark.slow
def test_smollm2_oracle_from_a_trl_dataset_with_a_reward_function(
    rewards_file, tmp_path, monkeypatch
) -> None:
    """The shipped SmolLM2 end to end: a TRL-style dataset folder, a reward by module name."""
    datasets = import_extra("datasets")
    datasets.Dataset.from_list(trl_rows(3)).save_to_disk(str(tmp_path / "ds"))
    monkeypatch.chdir(tmp_path)  # the module is found in the current folder, as a user's is
    from conftest import run_cli

    out = tmp_path / "smol"
    result = run_cli(
        [
            "oracle", "--model", "smollm2-135m", "--policy", "reference",
            "--prompts", f"trainer:{tmp_path / 'ds'}", "--n", "2", "--max-new-tokens", "12",
            "--device", "cpu", "--workers", "1", "--reward", "trl_rewards:unit",
            "--out", str(out),
        ],
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "each prompt as the trainer renders it" in " ".join(result.stderr.split())
    df = load_rollouts(out)
    assert df.height == 6 and set(df["verify_status"]) == {"reward_function"}
    prompts = load_prompts(out)
    assert prompts is not None
    level = dict(
        zip(
            prompts["prompt_id"],
            [json.loads(r)["level"] for r in prompts["trainer_row"]],
            strict=True,
        )
    )
    want = [
        (len(r) % 2 + level[p] % 2) / 2
        for r, p in zip(df["response"], df["prompt_id"], strict=True)
    ]
    assert df["reward"].to_list() == want
    step = basis_from_rollouts(out)
    assert step.cached.check([r["prompt"] for r in trl_rows(3)], "train") == 3


# --------------------------------------------------------------------------- the check


def cache_of(root: Path, prompts: list, trainer: bool) -> Path:
    """A reference cache of ``prompts`` (chats), 4 samples each; with ``trainer``, built from a
    trainer's dataset (the conversations kept)."""
    table = {
        "prompt_id": [f"q{i}" for i in range(len(prompts))],
        "problem": [p[-1]["content"] for p in prompts],
        "answer": ["1"] * len(prompts),
    }
    if trainer:
        table["trainer_prompt"] = [json.dumps(p, sort_keys=True) for p in prompts]
    write_parquet_atomic(pl.DataFrame(table), root / PROMPTS_FILE)
    rows = [
        {"prompt_id": f"q{i}", "policy": "reference", "sample_idx": s, "reward": float(s % 2)}
        for i in range(len(prompts))
        for s in range(4)
    ]
    write_parquet_atomic(pl.DataFrame(rows), root / "rollouts" / "reference.parquet")
    return root


def test_a_training_prompt_outside_the_cache_is_shown_beside_the_nearest(tmp_path) -> None:
    cache = cache_of(tmp_path / "c", [chat(i) for i in range(4)], trainer=True)
    cached = cached_prompts(cache, "{problem}")
    assert cached.check([chat(i) for i in (3, 1)], "train") == 2
    with pytest.raises(InputError) as caught:  # another system prompt: the same key
        cached.check([chat(1), chat(2, "Think step by step.")], "train")
    message = str(caught.value)
    assert "1 of the 2 prompts of train" in message
    assert "[system] Think step by step.\\n[user] What is 2 + 2?" in message  # the training text
    assert f"[system] {SYSTEM}\\n[user] What is 2 + 2?" in message  # the nearest cached one
    assert "differ from character 9" in message
    legacy = cached_prompts(
        cache_of(tmp_path / "l", [chat(i) for i in range(2)], False), "{problem}"
    )
    assert legacy.check([chat(1, "Other.")], "train") == 1  # keys alone: the user message
    with pytest.raises(InputError, match=r"'What is 7 \+ 7\?'.*\n.*'What is 1 \+ 1\?'"):
        legacy.check([chat(7)], "train")


def test_verl_train_files_are_checked_against_the_cache(tmp_path) -> None:
    cache = cache_of(tmp_path / "c", [chat(i, None) for i in range(3)], trainer=True)
    cached = cached_prompts(cache, "{problem}")
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pl.DataFrame({"prompt": [chat(i, None) for i in range(3)]}).write_parquet(good)
    pl.DataFrame({"prompt": [chat(0, None), chat(5, None)]}).write_parquet(bad)
    assert check_parquet_prompts(cached, [str(good)]) == 3
    with pytest.raises(
        InputError, match=r"(?s)1 of the 2 prompts of .*bad.parquet.*What is 5 \+ 5"
    ):
        check_parquet_prompts(cached, [str(good), str(bad)])
    with pytest.raises(InputError, match="could not read its 'question' column"):
        check_parquet_prompts(cached, str(good), "question")


def _trl():
    try:
        return importlib.import_module("basis_bench.integrations.trl_trainer")
    except Exception as exc:
        pytest.skip(f"trl does not import here: {type(exc).__name__}: {exc}")


def test_the_trl_trainer_refuses_a_mismatched_dataset_before_the_model_loads(tmp_path) -> None:
    trl = _trl()
    datasets = import_extra("datasets")
    cache = cache_of(tmp_path / "c", [chat(i) for i in range(4)], trainer=True)
    args = trl.BasisGRPOConfig(
        output_dir=str(tmp_path / "o"), per_device_train_batch_size=2, report_to=[], use_cpu=True
    )
    model = str(tmp_path / "no-model-here")  # loading it would fail: the check comes first
    wrong = datasets.Dataset.from_list([{"prompt": chat(1, "Other system prompt.")}])
    with pytest.raises(InputError, match=r"\[system\] Other system prompt.*\n.*cached:.*What is 1"):
        trl.BasisGRPOTrainer(
            model, lambda completions, **_: [0.0] * len(completions), args, wrong,
            basis=basis_from_rollouts(cache),
        )  # fmt: skip
    right = datasets.Dataset.from_list([{"prompt": chat(i)} for i in range(4)])
    with pytest.raises(Exception) as loading:  # past the check, TRL loads the model, and fails
        trl.BasisGRPOTrainer(
            model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=args, train_dataset=right, basis=basis_from_rollouts(cache),
        )  # fmt: skip
    assert not isinstance(loading.value, InputError)
    assert prompt_key(chat(1)) == prompt_key(chat(1, "Other system prompt."))  # one key, two talks


# --------------------------------------------------------------------------- training


def test_training_scores_with_the_reward_function_on_a_trainer_dataset(
    tiny_model, rewards_file, tmp_path
) -> None:
    """``train`` with ``reward_function`` on ``trainer:PATH`` prompts: the reference cache and
    each step's rollouts are scored by the function, on the prompts as the trainer renders them."""
    from basis_bench.train import make_config, train
    from basis_bench.train.config import config_dict

    pl.DataFrame(trl_rows(4)).write_parquet(tmp_path / "train.parquet")
    config = make_config(
        {
            "model": str(tiny_model),
            "device": "cpu",
            "cpu_threads": 1,
            "run_dir": str(tmp_path / "run"),
            "cache_dir": str(tmp_path / "cache"),
            "train_prompts": f"trainer:{tmp_path / 'train.parquet'}",
            "heldout_prompts": "arithmetic:n=2,digits=1,steps=1,ops=+,seed=1",
            "reward_function": f"{rewards_file}:unit",  # rewards in [0, 1], as BASIS assumes
            "rollouts_per_step": 4,
            "ref_n": 2,
            "max_new_tokens": 4,
            "steps": 1,
            "heldout_every": 0,
            "seed": 0,
        }
    )
    run = train(config)
    step = pl.read_parquet(run / "rollouts" / "train-000001.parquet")
    prompts = load_prompts(next((tmp_path / "cache").glob("ref-*")))
    assert prompts is not None
    level = dict(
        zip(
            prompts["prompt_id"],
            [json.loads(r)["level"] for r in prompts["trainer_row"]],
            strict=True,
        )
    )
    for rows in (step, load_rollouts(next((tmp_path / "cache").glob("ref-*")))):
        want = [
            (len(r) % 2 + level[p] % 2) / 2
            for r, p in zip(rows["response"], rows["prompt_id"], strict=True)
        ]
        assert rows["reward"].to_list() == want
        assert set(rows["verify_status"]) == {"reward_function"}
    wrong = {"reward_function": f"{rewards_file}:absent", "run_dir": str(tmp_path / "run2")}
    with pytest.raises(InputError, match="has no function 'absent'"):
        train(make_config({**config_dict(config), **wrong}))
    assert not (tmp_path / "run2").exists()  # refused before the run folder, or a model
