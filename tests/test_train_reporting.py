"""What a training run tells its user, read as the user reads it: `basis-bench train` in a
fresh process (stderr not a terminal, as in a batch job's log) on a tiny random Llama; its
TensorBoard events (report_to) read back with TensorBoard's own reader."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import needs_extra, run_cli

from basis_bench.rollouts.prompts import load_prompt_source
from basis_bench.train import make_config, read_log
from basis_bench.train.tracking import scalars

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAIN_PROMPTS = "arithmetic:n=8,digits=1,steps=1,ops=+,seed=0"
EVAL_PROMPTS = "arithmetic:n=40,digits=1,steps=1,ops=+,seed=1"  # some are training prompts
TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
needs_tensorboard = needs_extra("tensorboard")


def write_config(path: Path, model: Path, root: Path, **extra: object) -> Path:
    settings = {
        "model": str(model),
        "device": "cpu",
        "cpu_threads": 1,
        "run_dir": str(root / "run"),
        "cache_dir": str(root / "cache"),
        "train_prompts": TRAIN_PROMPTS,
        "heldout_prompts": EVAL_PROMPTS,
        "instruction": "Answer with the number only.",
        "answer_format": "number",
        "rollouts_per_step": 4,
        "ref_n": 4,
        "max_new_tokens": 8,
        "steps": 2,
        "heldout_every": 1,
        "checkpoint_every": 2,
        "seed": 2,
        **extra,
    }
    path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return path


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """One two-step BASIS run through the CLI: (run directory, its stderr)."""
    root = tmp_path_factory.mktemp("reporting")
    trackers = ["tensorboard"] if TENSORBOARD else ["none"]  # the rest holds without it
    config = write_config(root / "run.toml", tiny_model, root, report_to=trackers)
    done = run_cli(["train", "--config", str(config)])
    assert done.returncode == 0, done.stderr
    return root / "run", " ".join(done.stderr.split())


def test_the_reference_cache_build_is_announced_and_counted(trained):
    _, stderr = trained
    assert "reference cache: sampling 4 responses to each of 8 training prompts" in stderr
    assert "reference on hf: 32/32 samples, 8/8 prompts" in stderr


def test_a_held_out_count_below_the_configs_is_explained(trained):
    run_dir, stderr = trained
    train_ids = load_prompt_source(TRAIN_PROMPTS)["prompt_id"]
    asked = load_prompt_source(EVAL_PROMPTS)
    kept = asked.filter(~pl.col("prompt_id").is_in(train_ids.implode())).height
    assert 0 < kept < asked.height  # the settings do overlap
    assert (
        f"held-out accuracy is over {kept} prompts: {asked.height - kept} of the "
        f"{asked.height} in heldout_prompts are training prompts too and are left out"
    ) in stderr
    greedy = pl.read_parquet(run_dir / "eval" / "greedy-000000.parquet")
    assert greedy.height == kept and len(read_log(run_dir)) == 3


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of a run's TensorBoard events, read by TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


@needs_tensorboard
def test_report_to_tensorboard_holds_every_number_of_the_log(trained):
    run_dir, _ = trained
    logged = tensorboard_scalars(run_dir)
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in read_log(run_dir):
        for tag, value in scalars(record).items():
            expected.setdefault(tag, []).append((record["step"], value))
    assert logged.keys() == expected.keys()
    for tag, points in expected.items():  # float32 in the event files
        assert [s for s, _ in logged[tag]] == [s for s, _ in points], tag
        for (_, got), (_, want) in zip(logged[tag], points, strict=True):
            assert got == want or math.isclose(got, want, rel_tol=1e-6), (tag, got, want)
    # what a TRL user looks for: the reward, the loss, beta, held-out accuracy, phase times
    # beta as a finite number, or flagged: TensorBoard plots no infinity
    assert {
        "train/mean_reward",
        "train/loss",
        "train/beta_infinite",
        "eval/accuracy",
    } <= logged.keys()
    beta = dict(logged["train/beta_infinite"])
    assert set(beta.values()) <= {0.0, 1.0}
    assert {s for s, v in beta.items() if v == 0.0} == {s for s, _ in logged.get("train/beta", [])}
    assert {"seconds/sample", "seconds/update"} <= logged.keys()
    assert [s for s, _ in logged["eval/accuracy"]] == [0, 1, 2]


def test_report_to_reads_as_trl_spells_it():
    assert make_config({"report_to": "tensorboard"}).report_to == ("tensorboard",)
    assert make_config({}, ['report_to=["tensorboard", "wandb"]']).report_to == (
        "tensorboard",
        "wandb",
    )
    assert make_config({}, ["report_to=wandb,trackio"]).report_to == ("wandb", "trackio")
    assert make_config({}).report_to == ("none",)
    with pytest.raises(ValueError, match="report_to must be one of tensorboard, wandb, trackio"):
        make_config({"report_to": ["tensorbord"]})


# --------------------------------------------------------------------------- issue 44, class 8


@needs_tensorboard
def test_a_broken_tracker_package_is_one_line_before_a_model_loads(monkeypatch):
    """A broken tensorboard passed find_spec and raised ImportError after the model loaded."""
    import sys

    from basis_bench.errors import InputError
    from basis_bench.train.tracking import check_reporters

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # its import fails
    with pytest.raises(InputError, match="report_to = tensorboard: the 'tensorboard' package"):
        check_reporters(["tensorboard"])


def test_wandb_starts_offline_and_a_failing_init_is_one_line(monkeypatch, tmp_path):
    """wandb.init without a login or a network was a traceback, and nothing set offline
    mode though the docs say no tracker needs a network."""
    import sys

    from basis_bench.errors import InputError
    from basis_bench.train.tracking import check_reporters, open_trackers

    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "wandb.py").write_text(
        "import os\n"
        "def init(**kw):\n"
        "    if os.environ.get('WANDB_MODE') != 'offline':\n"
        "        raise RuntimeError('api_key not configured (no-tty)\\ncall wandb login')\n"
        "    raise OSError('disk says no')\n"
    )
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    check_reporters(["wandb"])
    with pytest.raises(InputError, match=r"report_to = wandb could not start \(OSError: disk"):
        open_trackers(["wandb"], tmp_path / "run", {}, 1)
    monkeypatch.setenv("WANDB_MODE", "online")  # the user's choice stands
    with pytest.raises(InputError, match="api_key not configured \\(no-tty\\)\\); fix it"):
        open_trackers(["wandb"], tmp_path / "run", {}, 1)


def test_a_tracker_that_cannot_start_stops_training_before_a_model_loads(monkeypatch, tmp_path):
    """wandb.init without a login was one line only after the model had loaded (and, for
    BASIS, the reference cache was built): the trackers open once run_dir is claimed."""
    import sys

    import basis_bench.train.setup as setup
    from basis_bench.errors import InputError
    from basis_bench.train import make_config
    from basis_bench.train.loop import train

    fake = tmp_path / "site"
    fake.mkdir()
    (fake / "wandb.py").write_text(
        "def init(**kw):\n    raise RuntimeError('api_key not configured (no-tty)')\n"
    )
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    monkeypatch.setattr(setup, "load_models", lambda *a, **k: pytest.fail("loaded a model"))
    run_dir = tmp_path / "run"
    config = make_config({"run_dir": str(run_dir), "report_to": ["wandb"], "estimator": "grpo"})
    with pytest.raises(InputError, match=r"report_to = wandb could not start \(RuntimeError"):
        train(config)
    assert not run_dir.exists()  # the claim is undone: a failed start leaves nothing new


def test_a_start_refused_after_the_trackers_opened_leaves_nothing(tmp_path):
    """The trackers open before a model loads; a model that does not exist then stops the
    run, and what their start wrote (RUN/tensorboard) goes with the claim."""
    from basis_bench.errors import InputError
    from basis_bench.train import make_config
    from basis_bench.train.loop import train

    if importlib.util.find_spec("tensorboard") is None:
        pytest.skip("tensorboard is not installed")
    run_dir = tmp_path / "run"
    settings = {"run_dir": str(run_dir), "report_to": ["tensorboard"], "estimator": "grpo"}
    config = make_config(settings | {"model": str(tmp_path / "no-model")})
    with pytest.raises(InputError, match="no such model"):
        train(config)
    assert not run_dir.exists()
