"""Everything a run needs before its first step, built from a :class:`TrainConfig`.

:func:`setup` returns a :class:`Run`: the torch runtime (threads, seed, device), the
training and held-out prompts, the policy, its tokenizer, the frozen reference and the
optimizer, the sampler, and the step estimator from :func:`make_estimator` (after the
reference cache, for estimators that use it). Nothing here runs a training step.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError, OneLineWarning
from basis_bench.settings import replaced
from basis_bench.train.config import TrainConfig, check_probe

if TYPE_CHECKING:
    from basis_bench.estimators import StepEstimator
    from basis_bench.rollouts.sampling import Sampler

LOG_FILE = "log.jsonl"
CHECKPOINTS_DIR = "checkpoints"


# --------------------------------------------------------------------------- torch runtime


def torch_runtime(config: TrainConfig) -> str:
    """The one place that sets torch's threads and seed; returns the resolved device."""
    import torch

    from basis_bench.rollouts.models import resolve_device

    device = resolve_device(config.generation.device)
    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    torch.manual_seed(config.seed)
    return device


def engine_dtype(config: TrainConfig) -> str:
    """The weights dtype of a sampler with a copy of its own (vLLM): the autocast precision,
    else "auto" (float32 on the CPU, where the engine then samples from exactly the policy's
    float32 weights; bfloat16 on GPUs)."""
    return "auto" if config.autocast == "none" else config.autocast


def training_backend(config: TrainConfig, device: str) -> type[Sampler]:
    """The sampling backend of ``config.generation.backend`` (``auto`` resolved for the policy's
    ``device``), checked before any model loads."""
    from basis_bench.rollouts.sampling import sampler_class

    backend = sampler_class(config.generation.backend, device)
    backend.check_training(device)
    return backend


# --------------------------------------------------------------------------- data


@dataclass
class Data:
    """Training and held-out prompts, the chat template, grading settings and worker pool."""

    train_set: pl.DataFrame
    heldout_set: pl.DataFrame
    template: Any  # PromptTemplate
    reward: Any  # RewardConfig
    pool: Any = None  # grading processes, or None to grade in this process


def one_line_note(text: str) -> None:
    """A note of training's set-up where no progress display takes it: one ``warning:`` line
    on the command line (a plain UserWarning showed the source file, line and call)."""
    warnings.warn(OneLineWarning(text), stacklevel=2)


def load_data(config: TrainConfig, note: Callable[[str], None] = one_line_note) -> Data:
    """Training prompts and held-out prompts: the held-out source minus any training prompt
    (``note`` says how many were left out), then its first ``heldout_limit``, so the limit
    counts prompts that are really held out."""
    from basis_bench.rollouts.prompts import load_prompt_source
    from basis_bench.rollouts.rewards import scoring_pool
    from basis_bench.rollouts.scoring import check_answers

    train_set = config.train.load()
    asked = load_prompt_source(config.heldout_prompts)
    outside = asked.filter(~pl.col("prompt_id").is_in(train_set["prompt_id"].implode()))
    if outside.height == 0:
        raise InputError("heldout_prompts has no prompt outside train_prompts")
    heldout_set = outside.head(config.heldout_limit) if config.heldout_limit else outside
    if outside.height < asked.height:
        kept = (
            f"; the first {heldout_set.height} of the rest are kept" if config.heldout_limit else ""
        )
        note(
            f"held-out accuracy is over {heldout_set.height} prompts: {asked.height - outside.height} "
            f"of the {asked.height} in heldout_prompts are training prompts too and are left out"
            + kept
        )
    for what, prompts in (("train_prompts", train_set), ("heldout_prompts", heldout_set)):
        check_answers(prompts, config.grading.reward_function, what)
    return Data(
        train_set,
        heldout_set,
        config.generation.template(config.train.prompts),
        config.grading.reward(config.train.prompts),  # answer_format auto: by the training prompts
        scoring_pool(config.grading.reward_workers) if config.grading.reward_workers else None,
    )


# --------------------------------------------------------------------------- models


@dataclass
class Models:
    """The trained policy, its tokenizer, the frozen reference (only with a KL term) and
    the optimizer; ``reference_ckpt`` is the configured model, ``policy_ckpt`` where the
    policy was loaded from (the checkpoint when resuming)."""

    policy: Any
    tokenizer: Any
    reference: Any
    optimizer: Any
    reference_ckpt: Any
    policy_ckpt: Any
    device: str


def trainable(model: Any) -> Any:
    """The model, refused if it is quantized (a GGUF load is already dequantized by
    :func:`basis_bench.rollouts.models.load_model`)."""
    if getattr(model, "hf_quantizer", None) is not None:
        raise InputError("cannot train a quantized model; load it in float32 or bfloat16")
    return model


def load_models(
    config: TrainConfig, device: str, resume: str | os.PathLike[str] | None = None
) -> Models:
    """Policy (from the checkpoint when resuming), frozen reference, AdamW."""
    import torch

    from basis_bench.rollouts.models import load_model, load_tokenizer, resolve_checkpoint

    reference_ckpt = resolve_checkpoint(config.generation.model)
    policy_ckpt = resolve_checkpoint(resume) if resume is not None else reference_ckpt
    policy = trainable(load_model(policy_ckpt, device, config.generation.dtype))
    tokenizer = load_tokenizer(policy_ckpt)
    if config.gradient_checkpointing:
        # transformers 5.2x renamed it (the old name warns); older versions have only the old one.
        enable = getattr(policy, "activation_checkpointing_enable", None)
        (enable or policy.gradient_checkpointing_enable)()
    reference = None
    if config.kl_coef > 0:
        reference = load_model(reference_ckpt, device, config.generation.dtype).requires_grad_(
            False
        )
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    return Models(policy, tokenizer, reference, optimizer, reference_ckpt, policy_ckpt, device)


# --------------------------------------------------------------------------- samplers


def make_training_sampler(
    backend: type[Sampler], config: TrainConfig, models: Models, template: Any
) -> Sampler:
    """The live policy (a backend without weight sync: hf), or an engine of the backend's own
    (vLLM) started from the reference checkpoint, on the policy's device, that gets the
    policy's weights after every update (:func:`sync_sampler`)."""
    settings = config.generation.sampler_settings(backend)
    if backend.capabilities.weight_sync:
        return backend.start(
            models.reference_ckpt, template, models.device, engine_dtype(config), settings
        )
    return backend.of_policy(
        models.policy, models.tokenizer, template, settings, models.policy_ckpt.name
    )


def sync_sampler(sampler: Sampler, policy: Any) -> None:
    """The policy's current weights into a sampler with a copy of its own (vLLM), so that
    the next step samples from them (one that samples the live policy: nothing to do)."""
    if sampler.capabilities.weight_sync:
        sampler.load_weights(policy.state_dict().items())


def reference_sampler(
    config: TrainConfig, models: Models, sampler: Sampler, template: Any, resumed: bool
) -> Sampler:
    """A sampler of the reference policy for the cache (only built when it is missing)."""
    if not resumed or sampler.capabilities.weight_sync:  # still the reference's weights
        return sampler
    return reference_hf_sampler(config, models, template, resumed)


def reference_hf_sampler(config: TrainConfig, models: Models, template: Any, resumed: bool) -> Any:
    """The reference policy as a transformers sampler: the policy itself before its first
    update, else the frozen reference (loaded here when there is no KL term)."""
    from basis_bench.rollouts.models import load_model, load_tokenizer
    from basis_bench.rollouts.sampling.hf import HFSampler

    if not resumed:
        return HFSampler(models.policy, models.tokenizer, template, config.generation.batch_size)
    generation = config.generation
    ref = models.reference or load_model(models.reference_ckpt, models.device, generation.dtype)
    return HFSampler(ref, load_tokenizer(models.reference_ckpt), template, generation.batch_size)


def reference_hidden_states(
    config: TrainConfig, models: Models, template: Any, resumed: bool, problems: Sequence[str]
) -> np.ndarray:
    """The reference's prompt hidden states by transformers, for a backend that gives none
    (vLLM's engine): the numbers the hf backend stores."""
    return reference_hf_sampler(config, models, template, resumed).prompt_hidden_states(problems)


# --------------------------------------------------------------------------- reference cache


def reference_cache(
    config: TrainConfig,
    prompts: pl.DataFrame,
    sampler_of_reference: Callable[[], Any],
    pool: Any = None,
    hidden_states: Callable[[Sequence[str]], np.ndarray] | None = None,
    progress: Any = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(P, n) reference rewards of the training prompts, sampled once and reused, and for an
    estimator that conditions on the prompt their features (P, d): the reference's final
    hidden state at each prompt's last token, the policy's own at step 0, by
    ``hidden_states`` when given (the vllm backend), else by the reference's sampler.

    The cache is an oracle run (:func:`~basis_bench.rollouts.oracle.run_oracle`, policy
    ``reference``) into ``cache_dir/ref-<hash>``, the hash covering the model by its
    weights' bytes and the prompts by their text (:mod:`basis_bench.rollouts.fingerprint`), template,
    sampling and grading settings, so any run that shares them reuses it and a
    killed build resumes; the features are stored in its prompts.parquet, so a resumed run
    reads the same ones. ``sampler_of_reference`` is only called when something is missing;
    ``progress`` (an :class:`~basis_bench.rollouts.oracle.OracleProgress`) shows the build.
    """
    from basis_bench import estimators as E
    from basis_bench.rollouts.features import prompt_features
    from basis_bench.rollouts.fingerprint import weights_sha256
    from basis_bench.rollouts.models import resolve_checkpoint
    from basis_bench.rollouts.oracle import OracleSource, run_identity, run_oracle
    from basis_bench.rollouts.oracle_job import OracleJob
    from basis_bench.rollouts.store import load_prompts, load_rollouts, reward_matrix
    from basis_bench.rollouts.trainer_prompts import PROMPT_COLUMN, ROW_COLUMN

    hidden = E.get(config.estimator).uses_features

    generation = config.generation  # a trainer's dataset holds its prompts whole: no template
    if config.train.is_trainer_dataset:
        generation = dataclasses.replace(generation, instruction="", system_prompt="")
    job = OracleJob(  # the run's own sections: generation (backend resolved), grading, prompts
        generation=generation,
        grading=config.grading,
        policy="reference",
        source=config.train,
        out=Path(config.cache_dir),
        n=config.ref_n,
        store_features="hidden" if hidden else "none",
    )
    # by content: the reference's weights and the prompts' text, not their path or ids
    name = config.generation.model
    model = {"name": name, "weights": weights_sha256(resolve_checkpoint(name).path)}
    held = ("prompt_id", "problem", "answer", PROMPT_COLUMN, ROW_COLUMN)  # a trainer's: its own
    texts = prompts.select(c for c in held if c in prompts.columns).write_csv()
    key = json.dumps({**run_identity(job, model), "prompts": texts}, sort_keys=True)
    job = dataclasses.replace(
        job, out=job.out / f"ref-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    )
    source = OracleSource(prompts, model, sampler_of_reference, "cache_dir", hidden_states)
    run_oracle(job, progress, source=source, pool=pool)
    ids = prompts["prompt_id"].to_list()
    rewards = reward_matrix(load_rollouts(job.out, ["reference"]), "reference", ids)
    return rewards, prompt_features(load_prompts(job.out), ids, "stored") if hidden else None


# --------------------------------------------------------------------------- the estimator


def make_estimator(
    config: TrainConfig,
    prompt_ids: Sequence[str] = (),
    ref_rewards: np.ndarray | None = None,
    features: np.ndarray | None = None,
) -> StepEstimator:
    """The one place that turns ``config.estimator`` + ``config.estimator_options`` into the
    step's baselines. ``prompt_ids`` and ``ref_rewards`` (P, n) are the training prompts and
    their reference-cache rewards, needed by estimators that use the cache; ``features``
    (P, d) their features, for an estimator that conditions on the prompt. The options are
    validated against the estimator's options dataclass (an unknown key names the valid ones).
    """
    from basis_bench import estimators as E

    estimator = E.get(config.estimator)
    if estimator.uses_cache and ref_rewards is None:
        raise InputError(f"estimator {estimator.name!r} needs the reference cache's rewards")
    check_estimator_options(config)
    return E.make_step_estimator(
        estimator.name,
        config.estimator_options,
        prompt_ids=list(prompt_ids) if estimator.uses_cache else None,
        ref_rewards=ref_rewards if estimator.uses_cache else None,
        features=features if estimator.uses_cache else None,
    )


def check_estimator_options(config: TrainConfig) -> None:
    """``estimator_options`` checked against the estimator's options dataclass (unknown
    keys and out-of-range values are an InputError), in :func:`setup` before any model
    loads."""
    from basis_bench import estimators as E

    E.parse_options(config.estimator, config.estimator_options)


def batch_shape(config: TrainConfig) -> tuple[int, int]:
    """(rollouts per prompt G', prompts per step B_p) for this estimator's rollout budget."""
    from basis_bench import estimators as E

    estimator = E.get(config.estimator)
    group = estimator.rollouts_per_prompt(config.group_size)
    if estimator.group and group < 2:
        raise InputError(f"estimator {estimator.name!r} needs group_size >= 2, got {group}")
    if config.rollouts_per_step % group:
        raise InputError(
            f"rollouts_per_step = {config.rollouts_per_step} is not a multiple of the "
            f"{group} rollouts per prompt that {estimator.name!r} takes"
        )
    if config.minibatches > config.rollouts_per_step:
        raise InputError(
            f"minibatches = {config.minibatches} exceeds the "
            f"{config.rollouts_per_step} rollouts of a step"
        )
    return group, config.rollouts_per_step // group


# --------------------------------------------------------------------------- the run


ORACLE_CHUNK_PROMPTS = 16  # the reference cache's oracle samples 16 prompts a part


def check_train_sizes(config: TrainConfig, prompts_per_step: int, n_train: int) -> None:
    """The run's allocation-sized settings against the memory budget, before a model loads
    (:func:`~basis_bench.guards.memory_check.check_sizes`): rollouts a step, the value probe's
    probe_prompts x probe_samples and the reference cache's ref_n samples of every training
    prompt (a part of 16 prompts sampled at once, then the whole cache read as a matrix).
    probe_samples=2000000 and ref_n=50000000 ended in a MemoryError after the model had
    loaded."""
    from basis_bench import estimators as E
    from basis_bench.guards.memory_check import Size, check_sizes, sampled_rollout_bytes

    rollout = sampled_rollout_bytes(
        config.generation.sampling(1, config.train.prompts).max_new_tokens
    )
    sizes = [Size("rollouts_per_step", config.rollouts_per_step, rollout)]
    if config.probe_every:
        sizes.append(Size("probe_samples", config.probe_samples, rollout * config.probe_prompts))
    if E.get(config.estimator).uses_cache:
        chunk = min(ORACLE_CHUNK_PROMPTS, n_train)
        sizes.append(Size("ref_n", config.ref_n, rollout * chunk + 72 * n_train))
    check_sizes("this training run", sizes)


@dataclass
class Run:
    """Everything the loop touches: settings, directory, data, models, sampler, estimator."""

    config: TrainConfig
    run_dir: Path
    group: int  # rollouts per prompt G'
    prompts_per_step: int  # B_p
    data: Data
    models: Models
    sampler: Sampler
    estimator: StepEstimator  # its state goes into checkpoints (checkpoint.estimator_state)


def setup(
    config: TrainConfig,
    resume: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Any = None,
    before_models: Callable[[], None] | None = None,
) -> Run:
    """Check the settings against the estimator and claim the run directory (new, empty or
    a training run: never a dataset, unless ``force``), then load data, models, sampler,
    cache. ``progress`` (an :class:`~basis_bench.rollouts.oracle.OracleProgress`) shows the
    reference cache's build and notes on the data; None: Python warnings only.
    ``before_models`` runs once every check has passed, before a model loads (training
    opens its trackers there)."""
    from basis_bench import estimators as E
    from basis_bench.guards.folders import appended_inside, read_small, refuse_long_names
    from basis_bench.guards.outputs import claim_output_dir
    from basis_bench.rollouts.sampling.registry import (
        AUTO,
        auto_note,
        sampler_class,
        start_sampler,
    )

    run_dir = Path(config.run_dir)
    refuse_long_names(run_dir, "run_dir")  # before the log check looks into it
    group, prompts_per_step = batch_shape(config)
    check_estimator_options(config)
    log = appended_inside(run_dir / LOG_FILE, run_dir)  # appended in place: never elsewhere
    if os.path.lexists(log) and not log.is_file():  # a FIFO: appending would wait for good
        read_small(log)
    if resume is None and log.is_file() and log.stat().st_size:
        raise InputError(
            f"{run_dir} already holds a run; continue it with --resume "
            f"{run_dir}/{CHECKPOINTS_DIR}/step-T, or choose another run_dir"
        )
    claim_output_dir(run_dir, "train-run", force=force, option="run_dir")
    device = torch_runtime(config)
    backend = training_backend(config, device)
    fallback = config.generation.backend == AUTO
    config = replaced(config, backend=backend.backend)  # recorded: auto resolved
    data = load_data(config, progress.warning if progress is not None else one_line_note)
    check_probe(config, group, data.train_set.height)
    check_train_sizes(config, prompts_per_step, data.train_set.height)
    if before_models is not None:
        before_models()
    models = load_models(config, device, resume)
    sampler = start_sampler(  # hf, where the engine auto chose does not start
        backend,
        fallback,
        lambda chosen: make_training_sampler(chosen, config, models, data.template),
    )
    backend = sampler_class(sampler.backend)
    config = replaced(config, backend=backend.backend)
    note = auto_note(device) if fallback else None  # why auto samples with hf: once it does
    if note:
        (progress.warning if progress is not None else one_line_note)(note)
    ref_rewards = features = None
    if E.get(config.estimator).uses_cache:
        of_reference = functools.partial(
            reference_sampler, config, models, sampler, data.template, resume is not None
        )
        hidden_states = (
            None
            if backend.capabilities.hidden_states
            else functools.partial(
                reference_hidden_states, config, models, data.template, resume is not None
            )
        )
        ref_rewards, features = reference_cache(
            config, data.train_set, of_reference, data.pool, hidden_states, progress
        )
    ids = data.train_set["prompt_id"].to_list()
    estimator = make_estimator(config, ids, ref_rewards, features)
    return Run(config, run_dir, group, prompts_per_step, data, models, sampler, estimator)
