"""Outputs tied to what they were computed from by content, not by path (issue 35, class
4): a model folder whose weights changed, shards of one policy with other settings, a
results table of a dataset that was re-imported in place."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error, run_main
from test_oracle import parts, tiny_args

from basis_bench.rollouts.store import load_rollouts
from basis_bench.settings import made

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _new_weights(model: Path) -> None:
    """The same architecture with other random weights, saved over the old ones."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    torch.manual_seed(1)
    LlamaForCausalLM(AutoConfig.from_pretrained(model)).save_pretrained(model)


def test_a_model_is_fingerprinted_by_its_weights_not_its_path(tiny_model, tmp_path):
    from basis_bench.rollouts import fingerprint

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    assert fingerprint.weights_sha256(copy) == fingerprint.weights_sha256(tiny_model)
    _new_weights(copy)
    assert fingerprint.weights_sha256(copy) != fingerprint.weights_sha256(tiny_model)
    (copy / "trainer_state.pt").write_bytes(b"optimizer")  # not the model
    before = fingerprint.weights_sha256(copy)
    assert fingerprint.weights_sha256(copy) == before
    assert fingerprint.weights_sha256(tmp_path / "hub/name") is None


def test_oracle_resume_into_a_policy_whose_weights_changed_is_refused(
    monkeypatch, capsys, tiny_model, tmp_path
):
    """It sampled the missing parts with the new weights beside the old ones."""
    model, out = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_model, model)
    assert run_main(monkeypatch, capsys, *tiny_args(model, out)).code == 0
    parts(out, "tiny")[-1].unlink()  # a run killed before its last part
    kept = load_rollouts(out)
    moved = tmp_path / "moved"  # the same weights elsewhere are the same model
    shutil.copytree(model, moved)
    _new_weights(model)
    result = run_main(monkeypatch, capsys, *tiny_args(model, out))
    assert_one_line_error(result, "different settings (model weights)")
    assert load_rollouts(out).equals(kept)
    assert run_main(monkeypatch, capsys, *tiny_args(moved, out)).code == 0
    assert len(parts(out, "tiny")) == 6


def test_shards_of_one_policy_with_other_settings_are_refused(
    monkeypatch, capsys, tiny_model, tmp_path
):
    """Shard 0/2 with --n 3 --temperature 1 and shard 1/2 with --n 2 --temperature 0.3
    both wrote into one policy: each shard checked only its own parts."""
    out = tmp_path / "out"
    first = tiny_args(tiny_model, out, "--shard", "0/2", "--temperature", "1")
    assert run_main(monkeypatch, capsys, *first).code == 0
    written = load_rollouts(out)
    second = tiny_args(tiny_model, out, "--shard", "1/2", "--temperature", "0.3")
    second[second.index("--n") + 1] = "2"
    assert_one_line_error(run_main(monkeypatch, capsys, *second), "different settings (sampling)")
    assert load_rollouts(out).equals(written)


SHARD_STARTING = """
import sys, time
from pathlib import Path
from basis_bench.rollouts.oracle import OracleSource, run_oracle
from basis_bench.rollouts.oracle_job import OracleJob, Shard
from basis_bench.settings import made
from basis_bench.rollouts.prompts import arithmetic_prompts

def loading():  # the shard has claimed the dataset and loads its model: no part yet
    print("loading", flush=True)
    time.sleep(600)

job = made(OracleJob, dict(model="m", policy="p", prompts="arithmetic", out=Path(sys.argv[1]),
                n=2, chunk_size=1, shard=Shard(0, 2), seed=0))
run_oracle(job, source=OracleSource(arithmetic_prompts(4, seed=0), {"name": "m"}, loading))
"""


class Loading(Exception):
    """The model load a shard reaches once every check has passed."""


def _shard_1_of_2(out: Path, seed: int) -> None:
    from basis_bench.rollouts.oracle import OracleSource, run_oracle
    from basis_bench.rollouts.oracle_job import OracleJob, Shard
    from basis_bench.rollouts.prompts import arithmetic_prompts

    def loading():
        raise Loading

    job = made(OracleJob, dict(model="m", policy="p", prompts="arithmetic", out=out, n=2,
                               chunk_size=1, shard=Shard(1, 2), seed=seed))  # fmt: skip
    run_oracle(job, source=OracleSource(arithmetic_prompts(4, seed=0), {"name": "m"}, loading))


def test_a_shard_started_beside_a_running_one_with_other_settings_is_refused(tmp_path):
    """Two shards started at one instant with different settings both found no part to
    compare with and mixed their rows in one policy. Shard 0/2 runs in its own process,
    held where it loads its model (nothing written but the claim), while shard 1/2 starts:
    with another seed it is refused; with the same seed it goes on to load its model; once
    shard 0/2 is killed, its settings bind no one."""
    import subprocess
    import sys

    from basis_bench.errors import InputError

    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-c", SHARD_STARTING, str(out)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert first.stdout is not None and first.stdout.readline() == "loading\n"
        with pytest.raises(InputError, match=r"shard 0/2 .* different settings \(seed\)"):
            _shard_1_of_2(out, seed=1)
        assert not (out / "rollouts").exists()
        with pytest.raises(Loading):
            _shard_1_of_2(out, seed=0)
    finally:
        first.kill()
        first.wait()
    with pytest.raises(Loading):
        _shard_1_of_2(out, seed=1)


def test_trains_reference_cache_is_rebuilt_when_the_weights_change(tiny_model, tmp_path):
    """The cache was keyed by the model's path: new weights in the folder reused it."""
    from basis_bench.rollouts.sampling.base import Samples
    from basis_bench.train.config import TrainConfig
    from basis_bench.train.setup import reference_cache

    calls = []

    class Boxed:
        def sample(self, problems, config, seed, on_progress=None):
            calls.append(len(problems))
            count = len(problems) * config.n
            return Samples(["\\boxed{1}"] * count, np.full(count, 3, np.int32), ["stop"] * count)

        def describe(self):
            return {"backend": "boxed"}

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    config = made(TrainConfig, dict(
        model=str(model), train_prompts="arithmetic:n=4,seed=1", cache_dir=str(tmp_path / "c"),
        ref_n=2,
    ))  # fmt: skip
    prompts = config.train.load()
    reference_cache(config, prompts, Boxed)
    reference_cache(config, prompts, Boxed)
    assert len(calls) == 1  # reused while nothing changed
    _new_weights(model)
    reference_cache(config, prompts, Boxed)
    assert len(calls) == 2 and len(list((tmp_path / "c").iterdir())) == 2
    edited = prompts.with_columns(problem=prompts["problem"] + " ")  # same ids, other text
    reference_cache(config, edited, Boxed)
    assert len(calls) == 3


def test_figures_skip_a_sensitivity_table_of_a_dataset_changed_in_place(
    monkeypatch, capsys, tmp_path
):
    """evaluate, then the dataset re-simulated at the same path, then sensitivity: Fig. 5
    drew the new data's sensitivity beside the old data's tables (compared by path)."""
    from conftest import EVAL, EVAL_GROUP

    from basis_bench.evaluation.figures import make_figures
    from basis_bench.rollouts.simulate import SimulationConfig, simulate

    data, res = tmp_path / "sim", tmp_path / "res"
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), data)
    evaluate = ["evaluate", "--rollouts", str(data), *EVAL_GROUP, "--no-trajectory"]
    assert run_main(monkeypatch, capsys, *evaluate, "--out", str(res)).code == 0
    sensitivity = ["sensitivity", "--rollouts", str(data), *EVAL, "--parameters", "eps"]
    assert run_main(monkeypatch, capsys, *sensitivity, "--out", str(res)).code == 0
    _, skipped = make_figures(res, tmp_path / "figs")
    assert "fig5_sensitivity" not in skipped, skipped
    simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6, seed=9), data)
    assert run_main(monkeypatch, capsys, *sensitivity, "--out", str(res)).code == 0
    _, skipped = make_figures(res, tmp_path / "figs")
    assert "different contents" in skipped["fig5_sensitivity"]


def test_resume_refuses_a_reference_whose_weights_changed_since(tiny_model, tmp_path):
    """The run's reference (its cache, its KL term) would change in the middle of a run."""
    import torch

    from basis_bench.errors import InputError
    from basis_bench.train import make_config
    from basis_bench.train.checkpoint import TRAINER_STATE, reference_weights, resume_config
    from basis_bench.train.config import config_dict

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    ckpt = tmp_path / "run" / "checkpoints" / "step-000002"
    ckpt.mkdir(parents=True)
    state = {"step": 2, "rng": {"torch": torch.get_rng_state()}, "optimizer": {}}
    config = config_dict(make_config({"model": str(model)}))
    torch.save(
        {**state, "config": config, "reference_weights": reference_weights(str(model))},
        ckpt / TRAINER_STATE,
    )
    assert resume_config(ckpt).generation.model == str(model)
    _new_weights(model)
    with pytest.raises(InputError, match="holds other weights than when the run started"):
        resume_config(ckpt)
