"""``basis-bench train`` and ``train-figures`` failures (issue 14): config mistakes are one
line before any model loads; ``--resume`` refuses truncated, garbage or moved checkpoints
before writing; a full disk leaves no partial checkpoint.
"""

from __future__ import annotations

import errno
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, mounted_tmpfs, needs_extra, run_main, snapshot

from basis_bench.errors import InputError

# --------------------------------------------------------------------------- train


def write_toml(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"a.toml": 'extends = "b.toml"', "b.toml": 'extends = "a.toml"'}, "extend each other in a loop"),
        ({"a.toml": 'extends = "a.toml"'}, "extend each other in a loop"),
        ({"a.toml": "estimator_options = 5"}, "'estimator_options' must be dict"),
        ({"a.toml": 'estimator = "grpo"\nestimator_options = {bogus = 1}'}, "unknown option(s) bogus for estimator 'grpo'"),
        ({"a.toml": "estimator_options = {bogus = 1}"}, "unknown option(s) bogus for estimator 'basis'"),
        ({"a.toml": "top_p = 1.5"}, "top_p must be in (0, 1]; got 1.5"),
        ({"a.toml": "lr = inf"}, "lr must be finite; got inf"),
        ({"a.toml": "lr = nan"}, "lr must be a number, not NaN"),
    ],
)  # fmt: skip
def test_train_config_mistakes_are_one_line_before_any_model_loads(
    monkeypatch, capsys, tmp_path, files, needle
):
    import basis_bench.train.setup as setup

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(setup, "load_models", no_load)
    for name, text in files.items():
        write_toml(tmp_path / name, f'run_dir = "{tmp_path / "run"}"\n{text}\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(tmp_path / "a.toml"))
    assert_one_line_error(result, needle)


def test_train_refuses_a_dataset_as_run_dir(monkeypatch, capsys, tmp_path, real_dataset):
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    before = snapshot(real_dataset)
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{real_dataset}"\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert_one_line_error(result, "run_dir", "real rollouts, not a training run", "--force")
    assert snapshot(real_dataset) == before


def test_resume_refuses_truncated_garbage_and_partial_checkpoints(monkeypatch, capsys, tmp_path):
    import torch

    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE, load_trainer_state
    from basis_bench.train.config import config_dict

    ckpt = tmp_path / "run" / "checkpoints" / "step-000001"
    ckpt.mkdir(parents=True)
    state = {"step": 1, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    torch.save({**state, "config": config_dict(make_config({}))}, ckpt / TRAINER_STATE)
    whole = (ckpt / TRAINER_STATE).read_bytes()
    assert load_trainer_state(ckpt)["step"] == 1
    cases = {
        "truncated": (whole[: len(whole) // 2], "truncated or corrupt"),
        "garbage": (b"garbage\n" * 10, "not a trainer state written by basis-bench"),
        "empty": (b"", "truncated or corrupt"),
    }
    for data, needle in cases.values():
        (ckpt / TRAINER_STATE).write_bytes(data)
        result = run_main(monkeypatch, capsys, "train", "--resume", str(ckpt))
        assert_one_line_error(result, str(ckpt), TRAINER_STATE, needle)
    torch.save([1, 2, 3], ckpt / TRAINER_STATE)
    assert_one_line_error(
        run_main(monkeypatch, capsys, "train", "--resume", str(ckpt)), "lacks step, config"
    )
    partial = ckpt.with_name("step-000002.partial")
    shutil.copytree(ckpt, partial)
    assert_one_line_error(
        run_main(monkeypatch, capsys, "train", "--resume", str(partial)), "unfinished checkpoint"
    )
    torch.save({**state, "config": config_dict(make_config({}))}, ckpt / TRAINER_STATE)
    for wrong in (ckpt.with_name("step-1"), tmp_path / "run"):  # a short name; the run itself
        result = run_main(monkeypatch, capsys, "train", "--resume", str(wrong))
        assert_one_line_error(result, f"no {TRAINER_STATE} there", f"found: {ckpt}")
        assert ".partial" not in result[1]


@pytest.mark.parametrize(
    "edit",
    [
        {"step": -3},
        {"step": "abc"},
        {"step": True},
        {"step": 2.0},
        {"config": "abc"},
        {"config": {1: 2}},
        {"optimizer": "abc"},
        {"rng": {"torch": "abc"}},
        {"rng": None},
        {"basis_previous_index": -1},
        {"estimator_state": [1, 2]},
    ],
    ids=lambda e: "-".join(f"{k}={v!r}" for k, v in e.items()),
)
def test_resume_checks_the_whole_trainer_state_before_writing(monkeypatch, capsys, tmp_path, edit):
    """Issue 35: a state with step=-3 emptied log.jsonl, then raised; config="abc" or
    step="abc" raised tracebacks. Every field is checked before a model loads or a file is
    written."""
    import torch

    import basis_bench.train.setup as setup
    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE
    from basis_bench.train.config import config_dict

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    log = tmp_path / "run" / "log.jsonl"
    log.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    state = {"step": 2, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    torch.save({**state, "config": config_dict(make_config({})), **edit}, ckpt / TRAINER_STATE)
    before = snapshot(tmp_path / "run")
    result = run_main(monkeypatch, capsys, "train", "--resume", str(ckpt))
    assert_one_line_error(result, TRAINER_STATE, f"{next(iter(edit))} = ")
    assert snapshot(tmp_path / "run") == before


def test_an_estimator_state_off_its_beta_grid_is_refused():
    """A ``basis_previous_index`` past the grid was stored and indexed at the next step."""
    from basis_bench.estimators import make_step_estimator
    from basis_bench.train.checkpoint import load_estimator_state

    ids, cache = ["a", "b"], np.array([[1.0, 0.0], [0.0, 1.0]])
    step = make_step_estimator(
        "basis", {"calibration": "previous"}, prompt_ids=ids, ref_rewards=cache
    )
    load_estimator_state(step, {"basis_previous_index": 3})
    assert step.previous_index == 3
    with pytest.raises(InputError, match="not an index of its beta grid"):
        load_estimator_state(step, {"basis_previous_index": len(step.table.betas)})
    grpo = make_step_estimator("grpo")
    with pytest.raises(InputError, match="not an index of its beta grid"):
        load_estimator_state(grpo, {"basis_previous_index": 0})


@pytest.mark.parametrize("size", ["16k", "64k"])  # full in safetensors / in torch.save
def test_a_disk_full_checkpoint_is_a_write_error_and_leaves_no_partial(tmp_path, size):
    """Issue 35: a full disk while a checkpoint was saved raised torch's RuntimeError
    ('unexpected pos') or a SafetensorError, a traceback, and left the .partial folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from basis_bench.train.checkpoint import save_checkpoint

    class Tokenizer:
        def save_pretrained(self, folder):
            (Path(folder) / "tokenizer.json").write_text("{}")

    config = LlamaConfig(
        vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters())
    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, f"size={size}") as mounted:
        if not mounted:
            pytest.skip("cannot mount a small tmpfs here")
        blob = {"blob": torch.zeros(100_000)}  # too big for the 64k disk once the model fits
        with pytest.raises(OSError) as err:
            save_checkpoint(disk / "step-000001", model, Tokenizer(), optimizer, 1, blob)
        assert err.value.errno == errno.ENOSPC  # the CLI's one line, exit 1
        assert list(disk.iterdir()) == []


def test_resume_cannot_move_the_run_elsewhere(monkeypatch, capsys, tmp_path):
    """Seen on a GPU: `--resume RUN/checkpoints/step-T --set run_dir=OTHER` loaded the model,
    then failed on OTHER's missing log. It is refused before anything loads."""
    import torch

    import basis_bench.train.setup as setup
    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE
    from basis_bench.train.config import config_dict

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    state = {"step": 2, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    torch.save({**state, "config": config_dict(make_config({}))}, ckpt / TRAINER_STATE)
    result = run_main(
        monkeypatch, capsys, "train", "--resume", str(ckpt), "--set", f'run_dir="{tmp_path / "b"}"'
    )
    assert_one_line_error(result, "--set run_dir cannot move it", str(tmp_path / "run"))
    assert not (tmp_path / "b").exists()


def test_a_checkpoints_corrupt_model_file_is_named(tmp_path):
    from transformers import LlamaConfig

    from basis_bench.rollouts.models import load_model, resolve_checkpoint

    ckpt = tmp_path / "step-000001"
    LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    ).save_pretrained(ckpt)  # fmt: skip
    for data in (b"garbage", b"\xff" * 8 + b"{}"):
        (ckpt / "model.safetensors").write_bytes(data)
        with pytest.raises(InputError, match=r"step-000001: cannot load the model .*corrupt"):
            load_model(resolve_checkpoint(ckpt), "cpu")


def test_a_log_line_cut_by_a_crash_is_dropped(tmp_path):
    from basis_bench.train import read_log

    (tmp_path / "log.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"st')
    assert [r["step"] for r in read_log(tmp_path)] == [0, 1]
    (tmp_path / "log.jsonl").write_text('{"step": 0}\nnot json\n')
    with pytest.raises(InputError, match=r"log\.jsonl:2: not a JSON record"):
        read_log(tmp_path)


@pytest.mark.parametrize(
    ("config", "log", "needle"),
    [
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"}, b"\xff\xfe\n",
         "log.jsonl:1: not UTF-8 text"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": 1, "mean_reward": 0.5}\n[1, 2]\n', "log.jsonl:2: not a JSON record (a list)"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": 1, "mean_reward": "high"}\n', "'mean_reward' is 'high', not a number"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": "x", "mean_reward": 0.5}\n', "'step' is 'x', not a number"),
        (None, b'{"step": 1, "mean_reward": 0.5}\n', "config.json: not a JSON configuration"),
        ({"estimator": "basis"}, b'{"step": 1, "mean_reward": 0.5}\n',
         "'group_size' is missing or not a int"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": 100000000000000000000, "mean_reward": 0.5}\n',
         "'step' is 100000000000000000000, not a step number"),
        ({"estimator": "basis", "group_size": 8, "loss": "gpg"},
         b'{"step": -1, "mean_reward": 0.5}\n', "'step' is -1, not a step number"),
    ],
)  # fmt: skip
def test_train_figures_refuses_a_broken_run_in_one_line(
    monkeypatch, capsys, tmp_path, config, log, needle
):
    """Each once a traceback (UnicodeDecodeError, AttributeError, a polars builder error,
    TypeError, KeyError); nothing is written."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config))
    (run / "log.jsonl").write_bytes(log)
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(run), "--out", str(out))
    assert_one_line_error(result, needle)
    assert not out.exists()


def test_train_figures_refuses_a_run_given_twice_and_train_a_setting_set_twice(
    monkeypatch, capsys, tmp_path
):
    """The run's curves were drawn twice under two labels; the later --set silently won."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(
        json.dumps({"estimator": "basis", "group_size": 8, "loss": "gpg"})
    )
    (run / "log.jsonl").write_text('{"step": 1, "mean_reward": 0.5}\n')
    out = tmp_path / "figs"
    args = ["train-figures", str(run), str(tmp_path / "." / "run"), "--out", str(out)]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "run", "is given twice")
    assert not out.exists()
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{tmp_path / "train"}"\n')
    args = ["train", "--config", str(config), "--set", "lr=1e-5", "--set", "lr=2e-5"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "--set lr is given twice")
    assert not (tmp_path / "train").exists()


# --------------------------------------------------------------------------- the messages


@needs_extra("hf", "torch")  # train checks its extra before it starts
def test_ctrl_c_in_train_does_not_promise_an_oracle_resume(monkeypatch, capsys, tmp_path):
    import basis_bench.train as train_pkg

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train_pkg, "train", interrupted)
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{tmp_path / "run"}"\n')
    code, message, _ = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert code == 130 and "--resume RUN/checkpoints/step-T" in message
    assert "completed parts" not in message


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


@pytest.mark.parametrize("parts", [("x" * 300, "run"), ("run", "x" * 300)])
def test_a_train_run_dir_name_too_long_is_one_line(monkeypatch, capsys, tmp_path, parts):
    """A long name above the last one was exit 1 (the check for an earlier run's log met
    ENAMETOOLONG before the claim's check)."""
    import basis_bench.train.setup as setup

    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    config = write_toml(tmp_path / "c.toml", f'run_dir = "{tmp_path.joinpath(*parts)}"\n')
    result = run_main(monkeypatch, capsys, "train", "--config", str(config))
    assert_one_line_error(result, "run_dir: the name xxxx", "is 300 bytes long", "at most 255")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml"]
