"""The training subsystem without a real model: configuration and its validation, the
step's prompts and advantages, make_estimator, the update on a tiny torch model (micro-
batching, the non-finite stop), checkpoint loading rules, figures and shipped configs."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from conftest import import_extra

from basis_bench.errors import InputError
from basis_bench.estimators.normalise import normalise_advantages
from basis_bench.settings import _field, flat_keys, setting_help
from basis_bench.train import make_config, make_estimator, parse_override, read_config_file, train
from basis_bench.train.checkpoint import estimator_state, load_estimator_state
from basis_bench.train.config import TrainConfig, config_dict
from basis_bench.train.sample import step_prompt_indices

# ---------------------------------------------------------------- configuration


def test_renamed_keys_are_read_for_one_release_with_a_notice(tmp_path):
    """A TOML file or --set with a setting's old name (ref_samples, eval_every,
    vllm_kv_cache_gib, ...) makes the same config as the new name, with one notice each;
    both names at once is an error."""
    from basis_bench.settings import RenamedSetting

    (tmp_path / "old.toml").write_text("ref_samples = 8\neval_every = 3\nvllm_kv_cache_gib = 2\n")
    with pytest.warns(RenamedSetting) as notices:
        old = make_config(read_config_file(tmp_path / "old.toml"), ["eval_prompts=arithmetic:n=9"])
    assert [str(w.message).split(" is renamed ")[0] for w in notices] == [
        "ref_samples", "eval_every", "vllm_kv_cache_gib", "eval_prompts",
    ]  # fmt: skip
    new = make_config(
        {"ref_n": 8, "heldout_every": 3, "kv_cache_gib": 2.0},
        ["heldout_prompts=arithmetic:n=9"],
    )
    assert old == new
    with pytest.raises(InputError, match="ref_samples and ref_n are the same setting; give ref_n"):
        make_config({"ref_samples": 8, "ref_n": 8})


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
    with pytest.raises(InputError, match="does not exist"):
        read_config_file(tmp_path / "missing.toml")


def test_every_float_setting_is_validated():
    keys = flat_keys(TrainConfig)  # the sections' settings too, by their keys
    floats = {k for k, key in keys.items() if typing.get_type_hints(key.owner)[key.field] is float}
    ranged = {
        k
        for k in keys
        if _field(TrainConfig, k).metadata["min_val"] is not None
        or _field(TrainConfig, k).metadata["max_val"] is not None
    }
    assert floats <= ranged, "a float setting without a range would skip validation"
    for key in floats:
        for bad in ("inf", "-inf", "nan"):
            with pytest.raises(InputError, match=f"{key} must be (finite|a number, not NaN)"):
                make_config({}, [f"{key}={bad}"])
    with pytest.raises(InputError, match="lr must be finite; got inf"):
        make_config({}, ["lr=inf"])
    for override in ("lr=0", "temperature=-1", "top_p=1.5", "clip_low=1", "kl_coef=-0.1"):
        with pytest.raises(InputError):
            make_config({}, [override])
    assert make_config({}, ["top_p=1", "clip_low=0", "kl_coef=0"]).generation.top_p == 1.0


def test_settings_that_depend_on_the_estimator_are_refused_before_loading():
    bad = make_config({}, ["estimator=grpo", "group_size=8", "rollouts_per_step=12"])
    with pytest.raises(InputError, match="not a multiple"):
        train(bad)
    with pytest.raises(InputError, match="unknown estimator"):
        train(make_config({}, ["estimator=nope"]))
    with pytest.raises(InputError, match="needs group_size >= 2"):
        train(make_config({}, ["estimator=grpo", "group_size=1"]))
    with pytest.raises(InputError, match="minibatches = 32 exceeds"):
        train(make_config({}, ["minibatches=32"]))


def test_a_run_directory_is_not_overwritten(tmp_path):
    (tmp_path / "log.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(InputError, match="already holds a run"):
        train(make_config({}, [f'run_dir="{tmp_path}"', "estimator=vanilla"]))


# ---------------------------------------------------------------- loop pieces


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


# ---------------------------------------------------------------- make_estimator


def test_make_estimator_basis_reports_beta_and_registry_estimators_get_their_batch():
    rng = np.random.default_rng(0)
    ids = [f"p{i}" for i in range(6)]
    ref = (rng.random((6, 8)) < 0.4).astype(float)
    rewards = np.array([[1.0], [0.0], [1.0], [0.0]])
    basis = make_estimator(make_config({}, ["estimator=basis"]), ids, ref)
    out = basis(ids[:4], rewards)
    assert out.baselines.shape == (4, 1) and out.beta is not None and out.beta_index is not None
    load_estimator_state(basis, {"basis_previous_index": 3})  # a checkpoint's keys, as written
    assert estimator_state(basis) == {"basis_previous_index": 3}

    rpp = make_estimator(make_config({}, ["estimator=reinforce_pp"]))
    out = rpp(ids[:4], rewards)
    assert np.allclose(out.baselines, 0.5) and out.beta is None

    cached = make_estimator(make_config({}, ["estimator=reference_mean"]), ids, ref)
    assert cached(ids[:4], rewards).baselines.shape == (4, 1)

    with pytest.raises(InputError, match="unknown option"):
        make_estimator(make_config({}, ["estimator_options.bogus=1"]), ids, ref)
    with pytest.raises(InputError, match="needs the reference cache"):
        make_estimator(make_config({}, ["estimator=basis"]))


def test_a_trainer_state_in_the_checkpoint_format_loads_into_the_step_estimator():
    """The estimator keys of trainer_state.pt are unchanged: a stateful estimator's state as
    plain lists under estimator_state, BASIS's index under basis_previous_index."""
    ids = [f"p{i}" for i in range(4)]
    ref = np.tile([[1.0, 0.0, 1.0]], (4, 1))
    tracker = make_estimator(make_config({}, ["estimator=spo_tracker"]), ids, ref)
    saved = {
        "basis_previous_index": None,
        "estimator_state": {"alpha": [2.0] * 4, "beta": [3.0] * 4},
    }
    load_estimator_state(tracker, saved)
    assert tracker.state_dict()["alpha"].tolist() == [2.0] * 4
    assert estimator_state(tracker) == saved


# ---------------------------------------------------------------- the update, tiny model


def tiny_lm(vocab: int = 11):
    """A bigram language model with the keyword interface token_logprobs calls."""
    torch = import_extra("hf", "torch")

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(vocab, 8)
            self.head = torch.nn.Linear(8, vocab)

        @property
        def device(self) -> torch.device:
            return self.head.weight.device

        def forward(self, input_ids, attention_mask, position_ids, use_cache, logits_to_keep):
            logits = self.head(self.emb(input_ids))
            return SimpleNamespace(logits=logits[:, -logits_to_keep:])

    return TinyLM()


PROMPTS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]
RESPONSES = [np.array([3, 4]), np.array([5, 6, 7]), np.array([8]), np.array([9, 2])]


def _update(config, advantages, model=None):
    torch = import_extra("hf", "torch")
    from basis_bench.train.update import update_policy

    model = model or tiny_lm()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    stats = update_policy(
        model,
        optimizer,
        None,
        PROMPTS,
        RESPONSES,
        np.asarray(advantages, dtype=float),
        config,
        np.random.default_rng(0),
        0,
        step=7,
    )
    return model, stats


@pytest.mark.parametrize("loss", ["gpg", "grpo", "gspo"])
def test_micro_batching_never_changes_the_step(loss):
    torch = import_extra("hf", "torch")
    adv = [1.0, -0.5, 0.25, -1.0]
    whole, a = _update(make_config({}, [f"loss={loss}", "micro_batch_size=4"]), adv)
    parts, b = _update(make_config({}, [f"loss={loss}", "micro_batch_size=1"]), adv)
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for p, q in zip(whole.parameters(), parts.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_logged_entropy_is_the_sampling_policys_mean_token_entropy(epochs):
    # the bigram model's next-token distribution depends on the previous token alone, so each
    # response token's entropy is that of softmax(head(emb(previous)) / T), T = 0.7
    torch = import_extra("hf", "torch")
    config = make_config({}, ["temperature=0.7", f"epochs={epochs}"])
    model = tiny_lm()
    with torch.no_grad():
        logp = torch.log_softmax(model.head(model.emb.weight) / 0.7, dim=-1)
        by_previous = -(logp.exp() * logp).sum(-1)
    previous = [t for p, r in zip(PROMPTS, RESPONSES, strict=True) for t in [p[-1], *r[:-1]]]
    expected = float(by_previous[previous].mean())  # 8 tokens, each counted once
    _, stats = _update(config, [1.0, -0.5, 0.25, -1.0], model)
    assert stats["entropy"] == pytest.approx(expected, rel=1e-6)
    assert 0 < expected < math.log(11)


def test_a_non_finite_loss_stops_the_run_before_the_weights_move():
    torch = import_extra("hf", "torch")
    from basis_bench.train.update import NonFiniteError

    model = tiny_lm()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError, match="step 7: the loss is nan"):
        _update(make_config({}, []), [1.0, math.nan, 0.0, 0.0], model)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def test_non_finite_weights_stop_the_run():
    torch = import_extra("hf", "torch")
    from basis_bench.train.update import NonFiniteError, _check_weights

    model = tiny_lm()
    _check_weights(1, model)
    with torch.no_grad():
        model.head.bias[0] = math.inf
    with pytest.raises(NonFiniteError, match="non-finite weights"):
        _check_weights(1, model)


# ---------------------------------------------------------------- checkpoints


def test_trainer_state_loads_weights_only_and_partial_checkpoints_are_refused(tmp_path):
    torch = import_extra("hf", "torch")
    from basis_bench.train.checkpoint import TRAINER_STATE, load_trainer_state, resume_config

    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    config = config_dict(make_config({}, ["steps=5"]))
    state = {"step": 2, "rng": {"torch": torch.get_rng_state()}, "config": config}
    torch.save(state, ckpt / TRAINER_STATE)
    assert load_trainer_state(ckpt)["step"] == 2
    resumed = resume_config(ckpt, ["steps=9"])
    assert resumed.steps == 9 and resumed.run_dir == str((tmp_path / "run").resolve())

    partial = ckpt.with_name("step-000004.partial")
    partial.mkdir()
    torch.save(state, partial / TRAINER_STATE)
    with pytest.raises(InputError, match="unfinished checkpoint"):
        load_trainer_state(partial)
    with pytest.raises(InputError, match=r"no trainer_state\.pt"):
        load_trainer_state(tmp_path)

    torch.save({**state, "extra": SimpleNamespace(code=1)}, ckpt / TRAINER_STATE)
    with pytest.raises(InputError, match="more than plain data"):
        load_trainer_state(ckpt)


# ---------------------------------------------------------------- figures and shipped configs


def test_train_figures_from_logs(tmp_path):
    from basis_bench.evaluation.figure_style import colours, label
    from basis_bench.guards.outputs import OUTPUT_MARKER
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
            record = {"step": t, "mean_reward": 0.1 * t, "beta": beta, "truncated_share": t / 4}
            append_jsonl(run / "log.jsonl", record | ({"eval_accuracy": 0.5} if t == 3 else {}))
    assert '"beta": "inf"' in (tmp_path / "b" / "log.jsonl").read_text()
    runs = [tmp_path / "b", tmp_path / "g"]
    written = plot_training(runs, tmp_path / "figs", smooth=2, label=label, colours=colours())
    assert {p.name for p in written} == {
        *(f"{stem}.{ext}" for stem in ("learning_curves", "beta") for ext in ("png", "pdf")),
        "training_summary.csv",
        "training_runs.csv",
        "training_table.csv",
        "training_table.md",
        *("training_findings.csv", "training_findings.md"),  # BASIS and GRPO: finding 1
    }
    hidden = {p.name for p in (tmp_path / "figs").glob(".*")}
    assert hidden == {OUTPUT_MARKER}, "no temporary or lock file left behind"
    table = pl.read_csv(tmp_path / "figs" / "training_summary.csv")
    grpo = table.filter(pl.col("label") == "GRPO (G=8)")
    assert grpo["eval_accuracy"].drop_nulls().to_list() == [0.25, 0.5]
    assert grpo["truncated_share"].drop_nulls().to_list() == [0.25, 0.5, 0.75]
    assert table.filter(pl.col("label") == "BASIS")["beta"].drop_nulls().to_list() == [
        math.inf,
        2.0,
        0.5,
    ]
    plot_training(runs, tmp_path / "plain")
    plain = pl.read_csv(tmp_path / "plain" / "training_summary.csv")
    assert set(plain["label"]) == {"basis", "grpo (G=8)"}
    # Runs without beta into the same folder: the earlier runs' beta.png was kept beside them.
    written = plot_training([tmp_path / "g"], tmp_path / "figs")
    assert not (tmp_path / "figs" / "beta.png").exists()
    assert not (tmp_path / "figs" / "beta.pdf").exists()
    assert {p.name for p in (tmp_path / "figs").iterdir() if not p.name.startswith(".")} == {
        p.name for p in written
    }


def test_no_line_joins_an_infinite_beta_and_accuracy_keeps_its_whole_range(tmp_path):
    """beta.png drew a line from beta = inf (plotted on the top line) down to the next beta,
    a slope made up by where that line sits; learning_curves.png zoomed 0.405 -> 0.432 (one
    held-out prompt) into a steep rise."""
    import matplotlib.pyplot as plt

    from basis_bench.train.figures import beta_figure, learning_curves
    from basis_bench.train.loop import append_jsonl
    from basis_bench.train.summary import load_arm

    run = tmp_path / "b"
    run.mkdir()
    config = {"estimator": "basis", "group_size": 1, "loss": "gpg"}
    (run / "config.json").write_text(json.dumps(config))
    append_jsonl(run / "log.jsonl", {"step": 0, "eval_accuracy": 0.405})
    betas = [0.5, math.inf, math.inf, 0.3]
    for t, beta in enumerate(betas, start=1):
        record = {"step": t, "mean_reward": 0.4, "beta": beta, "truncated_share": 0.0}
        append_jsonl(run / "log.jsonl", record | ({"eval_accuracy": 0.432} if t == 4 else {}))
    arm = load_arm(run)
    fig = beta_figure([(r, "BASIS", "C0") for r in arm.runs])
    line, hollow = fig.axes[0].get_lines()[:2]
    np.testing.assert_array_equal(line.get_ydata(), [0.5, np.nan, np.nan, 0.3])
    assert list(hollow.get_xdata()) == [2, 3] and hollow.get_markerfacecolor() == "none"
    top = fig.axes[0].get_yticks()[-1]  # the tick labelled infinity
    assert list(hollow.get_ydata()) == [top, top]
    curves = learning_curves([arm], ["BASIS"], ["C0"], 1)
    assert [ax.get_ylim() for ax in curves.axes] == [(-0.02, 1.02)] * 2
    plt.close(fig)
    plt.close(curves)


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
    for setting in ("cpu_compare", "qwen3_4b_dapo", "study"):
        budgets = {c.rollouts_per_step for p, c in configs.items() if p.parent.name == setting}
        assert len(budgets) == 1, f"{setting}: every run samples the same rollouts per step"
    compare = [c for p, c in configs.items() if p.parent.name == "cpu_compare"]
    assert len({c.steps for c in compare}) == 1
    study = {p.stem: c for p, c in configs.items() if p.parent.name == "study"}
    assert len({(c.steps, c.loss, c.seed) for c in study.values()}) == 1
    arms = {
        "grpo_g8": ("grpo", "group_std"),
        "vanilla": ("vanilla", "none"),
        "reinforce_pp": ("reinforce_pp", "batch_whiten"),
        "basis": ("basis", "none"),
        "basis_track": ("basis_track", "none"),
    }
    assert {n: (c.estimator, c.advantage_norm) for n, c in study.items() if n in arms} == arms
    # one rate for the main arms; a variant ARM_X (a second rate ARM_lrRATE, a sweep of BASIS's
    # own settings) differs from its arm in the one setting its name says, into its own folder
    changes = {"lr": "lr", "n": "ref_n", "previous": "estimator_options"}
    assert {c.lr for n, c in study.items() if n in arms} == {study["base"].lr}
    for name, config in study.items():
        if name in arms or name == "base":
            continue
        arm, variant = name.rsplit("_", 1)
        kind = variant.rstrip("0123456789e.-")
        setting = changes[kind]
        of_arm = config_dict(study[arm])
        differ = {key for key, value in config_dict(config).items() if of_arm[key] != value}
        assert differ == {setting, "run_dir"}, name
        assert not config.run_dir.startswith("runs/study/"), name
        if setting != "estimator_options":
            assert getattr(config, setting) == float(variant[len(kind) :]), name
    probes = {(c.probe_every, c.probe_prompts, c.probe_samples) for c in study.values()}
    assert probes == {(10, 16, 16)}, "every arm probes its value error alike"


def test_counts_and_seeds_are_checked_where_the_config_is_made():
    for override, message in (
        ("steps=0", "steps must be >= 1; got 0"),
        ("seed=-1", r"seed must be in \[0, 9223372036854775807\]; got -1"),
        ("heldout_every=-1", "heldout_every must be >= 0"),
        ("backend=tpu", "backend must be one of auto, hf, vllm; got 'tpu'"),
    ):
        with pytest.raises(InputError, match=message):
            make_config({}, [override])
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_config({}).steps = 3  # type: ignore[misc]


def test_the_training_docs_name_every_setting():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text()
    missing = [key for key in flat_keys(TrainConfig) if f"`{key}`" not in doc]
    assert not missing, f"docs/training.md does not name {missing}"


def test_every_setting_carries_its_help():
    for key in flat_keys(TrainConfig):
        assert setting_help(TrainConfig, key).endswith("."), key
