"""`basis-bench train`: a compact RLVR training loop with the advantage estimator as a plug-in.

In the spirit of cleanrl, the whole algorithm is :func:`train`, read top to bottom. One step t:

1. **prompts**: B_p = rollouts_per_step / G' prompts, G' = ``group_size`` for group
   estimators (GRPO, RLOO) and 1 otherwise, so every estimator gets the same rollout budget.
   Prompts come without replacement from a fresh permutation of the training set per epoch.
2. **sample**: G' responses per prompt from the current policy (``hf`` generate, or vLLM with
   the policy's weights copied in after every update), keeping the sampled token ids.
3. **reward**: math-verify scores them: r (B_p, G').
4. **estimate**: baselines b (B_p, G') from the registered estimator named ``estimator``
   (BASIS variants through :class:`~basis_bench.estimators.Basis`, which also reports the
   calibrated beta_t); advantages A = r - b, optionally normalised.
5. **update**: ``epochs`` passes over ``minibatches`` minibatches of the step's responses,
   one AdamW step each on the ``loss`` (gpg | grpo | gspo, :mod:`basis_bench.train.losses`) plus
   ``kl_coef`` times the k3 KL to the frozen reference, after clipping the gradient norm.

Before step 1 the run measures held-out greedy accuracy (step 0) and, for estimators that
use it, fills the reference cache: ``ref_samples`` rollouts per training prompt from the
initial policy, written by the oracle pipeline as a rollouts dataset under ``cache_dir``
and reused by every later run with the same model, prompts and sampling settings.
Every ``eval_every`` steps: held-out greedy accuracy. Every ``checkpoint_every`` steps: a
Hugging Face model directory (``basis-bench oracle --ckpt DIR`` loads it) with the optimizer,
step, RNG and estimator state beside it, from which ``--resume`` continues the step count.

Run directory::

    RUN/config.json              the resolved configuration
    RUN/log.jsonl                one JSON record per step (step 0: the initial evaluation)
    RUN/prompts.parquet          training and held-out prompts
    RUN/rollouts/train-T.parquet step T's rollouts (policy "train-T"), rollouts schema
    RUN/eval/greedy-T.parquet    held-out greedy responses after step T (policy "greedy-T")
    RUN/checkpoints/step-T/      save_pretrained model + tokenizer, trainer_state.pt
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
import time
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.prompts import DEFAULT_INSTRUCTION

LOSS_NAMES = ("gpg", "grpo", "gspo")
ADVANTAGE_NORMS = ("none", "group_std", "batch_std", "batch_whiten")
BASIS_FAMILY = ("basis", "basis_vop", "basis_rvg")  # served by estimators.Basis (reports beta)
CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE = "trainer_state.pt"
LOG_FILE = "log.jsonl"


# --------------------------------------------------------------------------- configuration


@dataclass
class TrainConfig:
    """Every setting of a run. TOML files set these keys (flat); ``--set key=value`` overrides.

    0 or "" means "not set" where TOML has no null: ``train_limit``/``eval_limit`` 0 = all
    prompts, ``eval_max_new_tokens`` 0 = ``max_new_tokens``, ``vllm_max_model_len`` 0 = the
    model's, ``system_prompt`` "" = the chat template's own system message.
    """

    # run
    run_dir: str = "runs/train"
    seed: int = 0
    steps: int = 20
    # policy (the reference is the same checkpoint, frozen)
    model: str = "smollm2-135m"
    device: str = "auto"
    cpu_threads: int = 0  # torch threads (0: torch's default; 1 is fastest on a busy machine)
    dtype: str = "float32"  # parameter dtype; keep float32 master weights for small updates
    autocast: str = "none"  # none | bfloat16 | float16: forward-pass precision
    gradient_checkpointing: bool = False
    backend: str = "hf"  # sampling backend: hf | vllm
    sample_batch_size: int = 64  # hf: sequences per generate call
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_len: int = 0
    # data
    train_prompts: str = "arithmetic:n=256,digits=1,steps=1,ops=+-,seed=0"
    train_limit: int = 0
    eval_prompts: str = "arithmetic:n=64,digits=1,steps=1,ops=+-,seed=1"
    eval_limit: int = 0
    instruction: str = DEFAULT_INSTRUCTION
    system_prompt: str = ""
    answer_format: str = "any"  # any | boxed | number (see basis_bench.rollouts.rewards)
    verify_timeout: float = 5.0
    reward_workers: int = 0  # processes grading responses (0: in this process)
    # rollouts
    rollouts_per_step: int = 16
    group_size: int = 8  # G for group estimators; single-rollout ones always sample 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    # reference cache (only for estimators that use it)
    ref_samples: int = 64
    cache_dir: str = "runs/cache"
    # advantage estimation
    estimator: str = "basis"
    estimator_options: dict[str, Any] = field(default_factory=dict)
    advantage_norm: str = "none"  # none | group_std | batch_std | batch_whiten
    # loss
    loss: str = "gpg"  # gpg | grpo | gspo
    loss_agg: str = "token_mean"  # token_mean | seq_mean (gspo is always per sequence)
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int = 16
    # optimiser
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # evaluation and checkpoints
    eval_every: int = 5
    eval_max_new_tokens: int = 0
    checkpoint_every: int = 10

    def check(self) -> None:
        """Settings that are wrong on their own (the estimator's needs are checked in train)."""
        from basis_bench.rollouts.rewards import ANSWER_FORMATS
        from basis_bench.train.losses import AGGREGATIONS

        choices = {
            "loss": LOSS_NAMES,
            "loss_agg": AGGREGATIONS,
            "advantage_norm": ADVANTAGE_NORMS,
            "backend": ("hf", "vllm"),
            "autocast": ("none", "bfloat16", "float16"),
            "answer_format": ANSWER_FORMATS,
        }
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise InputError(f"{key} must be one of {allowed}, got {getattr(self, key)!r}")
        positive = (
            "steps",
            "rollouts_per_step",
            "group_size",
            "max_new_tokens",
            "ref_samples",
            "epochs",
            "minibatches",
            "micro_batch_size",
            "sample_batch_size",
        )
        for key in positive:
            if getattr(self, key) < 1:
                raise InputError(f"{key} must be at least 1, got {getattr(self, key)}")
        nonnegative = (
            "train_limit",
            "eval_limit",
            "eval_every",
            "checkpoint_every",
            "eval_max_new_tokens",
            "vllm_max_model_len",
            "reward_workers",
            "cpu_threads",
            "kl_coef",
            "weight_decay",
            "clip_low",
            "clip_high",
        )
        for key in nonnegative:
            if getattr(self, key) < 0:
                raise InputError(f"{key} must be >= 0, got {getattr(self, key)}")
        if not (self.lr > 0 and self.max_grad_norm > 0 and self.temperature > 0):
            raise InputError("lr, max_grad_norm and temperature must be positive")


def _coerce(key: str, value: Any) -> Any:
    """``value`` as the type of config field ``key`` (ints widen to floats); else InputError."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    if key not in fields:
        raise InputError(f"unknown config key {key!r}; known keys: {', '.join(fields)}")
    kind = typing.get_type_hints(TrainConfig)[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    expected = dict if typing.get_origin(kind) is dict else kind
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise InputError(f"config key {key!r} must be {expected.__name__}, got {value!r}")
    return value


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Keys of a TOML config; ``extends = "base.toml"`` (relative to the file) is read first."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"config file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{path}: not valid TOML ({err})") from err
    base = data.pop("extends", None)
    merged = read_config_file(path.parent / base) if base else {}
    return {**merged, **data}


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` with a TOML value (``lr=3e-6``, ``loss="grpo"`` or bare ``loss=grpo``).

    ``estimator_options.NAME=value`` sets one estimator option.
    """
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"--set expects key=value, got {text!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word: a string
    return key.strip(), value


def make_config(
    values: Mapping[str, Any] | None = None, overrides: Sequence[str] = ()
) -> TrainConfig:
    """A checked :class:`TrainConfig` from file values plus ``key=value`` overrides."""
    settings = dict(values or {})
    options = dict(settings.get("estimator_options", {}))
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("estimator_options."):
            options[key.partition(".")[2]] = value
        else:
            settings[key] = value
            if key == "estimator_options":
                options = dict(_coerce(key, value))
    settings["estimator_options"] = options
    config = TrainConfig(**{k: _coerce(k, v) for k, v in settings.items()})
    config.check()
    return config


# --------------------------------------------------------------------------- small helpers


def derive_seed(*keys: int) -> int:
    """A 31-bit seed from integer keys, e.g. (run seed, step): independent streams per use."""
    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0] & 0x7FFFFFFF)


def step_prompt_indices(n_prompts: int, per_step: int, step: int, seed: int) -> np.ndarray:
    """Training-set rows of step ``step``'s prompts (steps count from 1).

    Positions (step-1)*per_step .. step*per_step-1 of an endless sequence of epochs, each a
    permutation of the training set seeded by (seed, epoch): no prompt repeats within an
    epoch, and any step's batch is known without replaying the ones before (resume).
    """
    pos = np.arange((step - 1) * per_step, step * per_step)
    epoch, offset = np.divmod(pos, n_prompts)
    rows = np.empty_like(pos)
    for e in np.unique(epoch):
        chosen = epoch == e
        rows[chosen] = np.random.default_rng([seed, int(e)]).permutation(n_prompts)[offset[chosen]]
    return rows


def normalise_advantages(advantages: np.ndarray, rewards: np.ndarray, mode: str) -> np.ndarray:
    """Optional rescaling of A (B_p, G), eps = 1e-6:

    group_std:    A / (std_k r_ik + eps)       (GRPO; sample std over the prompt's G rewards)
    batch_std:    A / (std A + eps)            (scale only, keeps each baseline's centring)
    batch_whiten: (A - mean A) / (std A + eps) (REINFORCE++'s global whitening)
    """
    eps = 1e-6
    if mode == "none":
        return advantages
    if mode == "group_std":
        if rewards.shape[1] < 2:
            raise InputError("advantage_norm = group_std needs G >= 2 rollouts per prompt")
        return advantages / (rewards.std(axis=1, ddof=1, keepdims=True) + eps)
    if mode == "batch_std":
        return advantages / (advantages.std() + eps)
    if mode == "batch_whiten":
        return (advantages - advantages.mean()) / (advantages.std() + eps)
    raise InputError(f"advantage_norm must be one of {ADVANTAGE_NORMS}, got {mode!r}")


@dataclass
class Rollouts:
    """One step's samples, prompt-major: rollout p * G + k is sample k of prompt p."""

    prompt_tokens: list[list[int]]  # per prompt
    response_tokens: list[np.ndarray]  # per rollout, cut after the first stop token
    responses: list[str]
    finish_reasons: list[str]


def sample_rollouts(sampler: Any, problems: Sequence[str], config: Any, seed: int) -> Rollouts:
    """The step's rollouts, keeping the sampled token ids that the loss scores."""
    tokens = sampler.sample_tokens(problems, config, seed)
    texts = list(sampler.tokenizer.batch_decode(tokens.response_ids, skip_special_tokens=True))
    return Rollouts(tokens.prompt_ids, tokens.response_ids, texts, tokens.finish_reasons)


def token_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[np.ndarray],
    pad_id: int,
    temperature: float,
    autocast: str = "none",
) -> tuple[Any, Any]:
    """log pi(y_t | x, y_<t) of each sampled response token: (N, T) and its mask (N, T).

    Prompts are left-padded to one width W and responses right-padded after them, so every
    response starts at column W as in generation; position ids count real tokens only.
    Only the last T + 1 positions go through the LM head (prompt logits are never needed),
    and the logits are divided by the sampling temperature.
    """
    import torch

    n, width = len(prompts), max(len(p) for p in prompts)
    t = max(1, max(len(r) for r in responses))
    ids = torch.full((n, width + t), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width + t), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, width - len(p) : width] = torch.as_tensor(p, dtype=torch.long)
        ids[i, width : width + len(r)] = torch.as_tensor(r, dtype=torch.long)
        attention[i, width - len(p) : width + len(r)] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    device = model.device
    ids, attention, positions = ids.to(device), attention.to(device), positions.to(device)
    precision = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(autocast)
    with torch.autocast(device.type, dtype=precision, enabled=precision is not None):
        out = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=t + 1,
        )
    logits = out.logits[:, :-1].float() / temperature
    targets = ids[:, width:]
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1)
    return logp, attention[:, width:].to(logp.dtype)


def trainable(model: Any) -> Any:
    """The model, refused if it is quantized (a GGUF load is already dequantized by
    :func:`basis_bench.rollouts.models.load_model`)."""
    if getattr(model, "hf_quantizer", None) is not None:
        raise InputError("cannot train a quantized model; load it in float32 or bfloat16")
    return model


def append_jsonl(path: Path, record: Mapping[str, Any]) -> None:
    """One record per line, strict JSON: beta = inf is written as the string "inf"."""
    if isinstance(record.get("beta"), float) and math.isinf(record["beta"]):
        record = {**record, "beta": "inf"}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, allow_nan=False) + "\n")


def read_log(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The step records of a run's ``log.jsonl`` (beta "inf" read back as a float)."""
    path = Path(run_dir) / LOG_FILE
    if not path.is_file():
        raise InputError(f"{run_dir}: no {LOG_FILE}; is this a training run directory?")
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    for r in records:
        if r.get("beta") == "inf":
            r["beta"] = math.inf
    return records


def rollout_frame(
    prompt_ids: Sequence[str],
    policy: str,
    rewards: np.ndarray,
    statuses: Sequence[str],
    responses: Sequence[str],
    n_tokens: Sequence[int] | np.ndarray,
    finish: Sequence[str],
) -> pl.DataFrame:
    """Rollouts in the store's schema; sample_idx numbers the rows (a prompt may recur)."""
    from basis_bench.rollouts.store import conform_rollouts

    frame = pl.DataFrame(
        {
            "prompt_id": list(prompt_ids),
            "policy": [policy] * len(prompt_ids),
            "sample_idx": np.arange(len(prompt_ids), dtype=np.int32),
            "reward": np.asarray(rewards, dtype=np.float64),
            "n_tokens": np.asarray(n_tokens, dtype=np.int32),
            "finish_reason": list(finish),
            "response": list(responses),
            "verify_status": list(statuses),
        }
    )
    return conform_rollouts(frame, what=policy)


# --------------------------------------------------------------------------- reference cache


def reference_cache(
    config: TrainConfig,
    prompts: pl.DataFrame,
    template: Any,
    reward_config: Any,
    sampler_of_reference: Callable[[], Any],
    pool: Any = None,
) -> np.ndarray:
    """(P, n) reference rewards of the training prompts, sampled once and reused.

    The cache is an oracle-pipeline rollouts dataset (policy ``reference``) in
    ``cache_dir/ref-<hash>``, the hash covering model, prompts, template, sampling and
    grading settings, so any run that shares them reuses it and a killed build resumes.
    ``sampler_of_reference`` is only called when some chunk is missing.
    """
    from basis_bench.rollouts.oracle import (
        OracleJob,
        base_metadata,
        pending_chunks,
        run_chunks,
        run_identity,
        write_prompts_table,
    )
    from basis_bench.rollouts.sampling import SamplingConfig
    from basis_bench.rollouts.store import load_rollouts, reward_matrix

    job = OracleJob(
        policy="reference",
        sampling=SamplingConfig(
            n=config.ref_samples,
            temperature=config.temperature,
            top_p=config.top_p,
            max_new_tokens=config.max_new_tokens,
        ),
        reward=reward_config,
    )
    identity = run_identity(
        job,
        model={"name": config.model},
        template={"instruction": template.instruction, "system": template.system},
    )
    key = json.dumps({**identity, "prompts": prompts["prompt_id"].to_list()}, sort_keys=True)
    out = Path(config.cache_dir) / f"ref-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    out.mkdir(parents=True, exist_ok=True)
    metadata = base_metadata({"source": config.train_prompts, "n_prompts": prompts.height})
    todo, _ = pending_chunks(prompts, out, job, identity)
    write_prompts_table(prompts, out, metadata)
    if todo:
        run_chunks(todo, sampler_of_reference(), out, job, identity, metadata, pool)
    rewards = reward_matrix(
        load_rollouts(out, ["reference"]), "reference", prompts["prompt_id"].to_list()
    )
    return rewards


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    path: Path, policy: Any, tokenizer: Any, optimizer: Any, step: int, extra: dict[str, Any]
) -> Path:
    """``save_pretrained`` model + tokenizer and ``trainer_state.pt`` (optimizer, step, RNG
    states, estimator state, config), written beside and renamed into place when complete."""
    import shutil

    import torch

    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    state = {"step": step, "optimizer": optimizer.state_dict(), "rng": rng, **extra}
    torch.save(state, tmp / TRAINER_STATE)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def load_trainer_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer state saved with a checkpoint (``--resume`` needs it)."""
    import torch

    path = Path(checkpoint) / TRAINER_STATE
    if not path.is_file():
        raise InputError(
            f"--resume {checkpoint}: no {TRAINER_STATE} there; pass a checkpoint directory "
            f"written by basis-bench train (RUN/{CHECKPOINTS_DIR}/step-T)"
        )
    state: dict[str, Any] = torch.load(path, weights_only=False)
    return state


def resume_config(checkpoint: str | os.PathLike[str], overrides: Sequence[str] = ()) -> TrainConfig:
    """The run's own configuration from a checkpoint, ``run_dir`` set to the directory that
    holds it (so a moved run resumes in place), then ``overrides`` (e.g. ``steps=60``)."""
    values = dict(load_trainer_state(checkpoint)["config"])
    values["run_dir"] = str(Path(checkpoint).resolve().parent.parent)
    return make_config(values, overrides)


# --------------------------------------------------------------------------- the update


def frozen_logprobs(
    model: Any,
    prompt_tokens: Sequence[Sequence[int]],
    responses: Sequence[np.ndarray],
    config: TrainConfig,
    pad_id: int,
) -> Any:
    """Token log-probs (N, T_max) of all responses under ``model``, without gradient."""
    import torch

    n, width = len(responses), max(1, max(len(r) for r in responses))
    out = torch.zeros((n, width), device=model.device)
    with torch.no_grad():
        for start in range(0, n, config.micro_batch_size):
            idx = list(range(start, min(start + config.micro_batch_size, n)))
            logp, _ = token_logprobs(
                model,
                [prompt_tokens[i] for i in idx],
                [responses[i] for i in idx],
                pad_id,
                config.temperature,
                config.autocast,
            )
            out[idx, : logp.shape[1]] = logp
    return out


def update_policy(
    policy: Any,
    optimizer: Any,
    reference: Any,
    prompt_tokens: Sequence[Sequence[int]],
    responses: Sequence[np.ndarray],
    advantages: np.ndarray,
    config: TrainConfig,
    rng: np.random.Generator,
    pad_id: int,
) -> dict[str, float | None]:
    """``epochs`` passes over ``minibatches`` shuffled minibatches of the N responses, one
    AdamW step each on loss + kl_coef * KL, the gradient accumulated over micro-batches
    with the minibatch's denominator (so micro-batching never changes the step).
    """
    import torch

    from basis_bench.train import losses

    n = len(responses)
    adv = torch.as_tensor(advantages, dtype=torch.float32, device=policy.device)
    agg: Any = "seq_mean" if config.loss == "gspo" else config.loss_agg
    # Sampling-time log-probs are needed once the policy moves within the step; for a single
    # update they equal the detached current ones (the ratio is exactly 1).
    several = config.epochs * config.minibatches > 1
    old_logp = (
        frozen_logprobs(policy, prompt_tokens, responses, config, pad_id) if several else None
    )
    ref_logp = (
        frozen_logprobs(reference, prompt_tokens, responses, config, pad_id)
        if reference is not None
        else None
    )
    totals: list[float] = []
    kls: list[float] = []
    norms: list[float] = []
    for _ in range(config.epochs):
        for minibatch in np.array_split(rng.permutation(n), config.minibatches):
            lengths = [len(responses[i]) for i in minibatch]
            denom = float(sum(lengths)) if agg == "token_mean" else float(len(minibatch))
            optimizer.zero_grad(set_to_none=True)
            total = kl_total = 0.0
            for part in np.array_split(minibatch, -(-len(minibatch) // config.micro_batch_size)):
                logp, mask = token_logprobs(
                    policy,
                    [prompt_tokens[i] for i in part],
                    [responses[i] for i in part],
                    pad_id,
                    config.temperature,
                    config.autocast,
                )
                width = logp.shape[1]
                old = old_logp[part, :width] if old_logp is not None else logp.detach()
                if config.loss == "gpg":
                    loss = losses.gpg_loss(logp, adv[part], mask, agg, denom)
                elif config.loss == "grpo":
                    loss = losses.grpo_loss(
                        logp, old, adv[part], mask, config.clip_low, config.clip_high, agg, denom
                    )
                else:
                    loss = losses.gspo_loss(
                        logp, old, adv[part], mask, config.clip_low, config.clip_high, denom
                    )
                if ref_logp is not None:
                    kl = losses.kl_k3(logp, ref_logp[part, :width], mask, agg, denom)
                    loss = loss + config.kl_coef * kl
                    kl_total += float(kl.detach())
                loss.backward()
                total += float(loss.detach())
            norms.append(
                float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm))
            )
            optimizer.step()
            totals.append(total)
            kls.append(kl_total)
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": float(np.mean(totals)),
        "kl": float(np.mean(kls)) if reference is not None else None,
        "grad_norm": float(np.mean(norms)),
    }


# --------------------------------------------------------------------------- the loop


def train(
    config: TrainConfig,
    resume: str | os.PathLike[str] | None = None,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Run (or, from a checkpoint, continue) training; returns the run directory.

    ``on_record`` receives each log record as it is written (for progress output).
    """
    import torch

    from basis_bench import estimators as E
    from basis_bench.rollouts.models import (
        load_model,
        load_tokenizer,
        resolve_checkpoint,
        resolve_device,
    )
    from basis_bench.rollouts.prompts import PromptTemplate, load_prompt_source
    from basis_bench.rollouts.rewards import RewardConfig, score_many, scoring_pool
    from basis_bench.rollouts.sampling import SamplingConfig
    from basis_bench.rollouts.sampling.hf import HFSampler
    from basis_bench.rollouts.store import write_parquet_atomic

    config.check()
    run_dir = Path(config.run_dir)
    estimator = E.get(config.estimator)
    group = estimator.rollouts_per_prompt(config.group_size)
    if estimator.group and group < 2:
        raise InputError(f"estimator {estimator.name!r} needs group_size >= 2, got {group}")
    if config.rollouts_per_step % group:
        raise InputError(
            f"rollouts_per_step = {config.rollouts_per_step} is not a multiple of the "
            f"{group} rollouts per prompt that {estimator.name!r} takes"
        )
    prompts_per_step = config.rollouts_per_step // group
    if config.minibatches > config.rollouts_per_step:
        raise InputError(
            f"minibatches = {config.minibatches} exceeds the {config.rollouts_per_step} rollouts of a step"
        )
    if resume is None and (run_dir / LOG_FILE).is_file() and (run_dir / LOG_FILE).stat().st_size:
        raise InputError(
            f"{run_dir} already holds a run; continue it with --resume "
            f"{run_dir}/{CHECKPOINTS_DIR}/step-T, or choose another run_dir"
        )
    device = resolve_device(config.device)
    if config.cpu_threads:
        torch.set_num_threads(config.cpu_threads)
    torch.manual_seed(config.seed)

    # ---- data: training prompts and held-out prompts (minus any training prompt)
    train_set = load_prompt_source(config.train_prompts, limit=config.train_limit or None)
    eval_set = load_prompt_source(config.eval_prompts, limit=config.eval_limit or None)
    eval_set = eval_set.filter(~pl.col("prompt_id").is_in(train_set["prompt_id"].implode()))
    if eval_set.height == 0:
        raise InputError("eval_prompts has no prompt outside train_prompts")
    train_ids = train_set["prompt_id"].to_list()
    template = PromptTemplate(config.instruction, config.system_prompt or None)
    reward_config = RewardConfig(config.answer_format, config.verify_timeout)  # type: ignore[arg-type]
    pool = scoring_pool(config.reward_workers) if config.reward_workers else None

    # ---- policy (from the checkpoint when resuming), frozen reference, optimizer
    reference_ckpt = resolve_checkpoint(config.model)
    policy_ckpt = resolve_checkpoint(resume) if resume is not None else reference_ckpt
    policy = trainable(load_model(policy_ckpt, device, config.dtype))
    tokenizer = load_tokenizer(policy_ckpt)
    if config.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    reference = None
    if config.kl_coef > 0:
        reference = load_model(reference_ckpt, device, config.dtype).requires_grad_(False)
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )

    # ---- sampler: the live policy (hf), or a vLLM engine that gets the policy's weights
    if config.backend == "vllm":
        # In-process engine: apply_model runs our weight copy directly, nothing is pickled.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from basis_bench.rollouts.sampling.vllm import VLLMSampler

        sampler: Any = VLLMSampler(
            reference_ckpt,
            template,
            dtype="bfloat16" if config.autocast == "none" else config.autocast,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
            max_model_len=config.vllm_max_model_len or None,
        )
    else:
        sampler = HFSampler(policy, tokenizer, template, config.sample_batch_size, policy_ckpt.name)

    def sync_sampler() -> None:
        """vLLM: copy the policy's current weights into the engine (HF samples the policy itself)."""
        if config.backend == "vllm":
            weights = list(policy.state_dict().items())
            sampler.llm.apply_model(lambda model: model.load_weights(weights))
            sampler.llm.reset_prefix_cache()

    def reference_sampler() -> Any:
        """A sampler of the reference policy for the cache (only built when it is missing)."""
        if resume is None or config.backend == "vllm":  # still the reference's weights
            return sampler
        ref = reference or load_model(reference_ckpt, device, config.dtype)
        return HFSampler(ref, load_tokenizer(reference_ckpt), template, config.sample_batch_size)

    # ---- the estimator: BASIS variants via estimators.Basis, any other through the registry
    basis: E.Basis | None = None
    cache_table: E.Basis | None = None
    if estimator.uses_cache:
        ref_rewards = reference_cache(
            config, train_set, template, reward_config, reference_sampler, pool
        )
        if estimator.name in BASIS_FAMILY:
            options = {**estimator.defaults, **config.estimator_options}
            unknown = set(options) - set(inspect.signature(E.Basis).parameters)
            if unknown:
                raise InputError(f"estimator_options {sorted(unknown)} are not options of Basis")
            basis = E.Basis(train_ids, ref_rewards, **options)
        else:
            cache_table = E.Basis(train_ids, ref_rewards)  # only its (K, P) tilt tables

    def baselines_of(
        batch_ids: list[str], rewards: np.ndarray
    ) -> tuple[np.ndarray, float | None, int | None]:
        """b (B_p, G) for this batch's rewards (B_p, G), and the calibrated beta and its index."""
        if basis is not None:
            out = basis(batch_ids, rewards[:, 0])
            return np.asarray(out.baselines)[:, None], out.beta, out.beta_index
        inputs = E.EstimatorInput(rewards)
        if cache_table is not None:
            cols = cache_table.columns(batch_ids)
            inputs = E.EstimatorInput(
                rewards,
                cache_table.v_table[:, cols],
                cache_table.var_table[:, cols],
                cache_table.betas,
            )
        return (
            np.asarray(estimator(inputs, **config.estimator_options), dtype=np.float64),
            None,
            None,
        )

    # ---- run directory, log, and resume state
    log_path = run_dir / LOG_FILE
    start = 1
    if resume is not None:
        state = load_trainer_state(resume)
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        if basis is not None and state.get("basis_previous_index") is not None:
            basis.previous_index = int(state["basis_previous_index"])
        start = int(state["step"]) + 1
        kept = [r for r in read_log(run_dir) if r["step"] < start]  # drop steps being redone
        log_path.write_text("", encoding="utf-8")
        for r in kept:
            append_jsonl(log_path, r)
        sync_sampler()
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path.write_text("", encoding="utf-8")
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    write_parquet_atomic(
        pl.concat([train_set, eval_set], how="diagonal_relaxed"), run_dir / "prompts.parquet"
    )

    def log(record: dict[str, Any]) -> None:
        append_jsonl(log_path, record)
        if on_record is not None:
            on_record(record)

    def evaluate(step: int) -> float:
        """Held-out accuracy of greedy responses; the responses go to RUN/eval/."""
        greedy = SamplingConfig(
            n=1, temperature=0.0, max_new_tokens=config.eval_max_new_tokens or config.max_new_tokens
        )
        samples = sampler.sample(eval_set["problem"].to_list(), greedy, seed=0)
        scored = score_many(
            [[r] for r in samples.responses], eval_set["answer"].to_list(), reward_config, pool
        )
        rewards = np.concatenate([r for r, _ in scored])
        frame = rollout_frame(
            eval_set["prompt_id"].to_list(),
            f"greedy-{step:06d}",
            rewards,
            [s for _, st in scored for s in st],
            samples.responses,
            samples.n_tokens,
            samples.finish_reasons,
        )
        write_parquet_atomic(frame, run_dir / "eval" / f"greedy-{step:06d}.parquet")
        return float(rewards.mean())

    def checkpoint(step: int) -> None:
        save_checkpoint(
            run_dir / CHECKPOINTS_DIR / f"step-{step:06d}",
            policy,
            tokenizer,
            optimizer,
            step,
            {
                "config": dataclasses.asdict(config),
                "basis_previous_index": None if basis is None else basis.previous_index,
            },
        )

    if start == 1 and config.eval_every:
        tic = time.perf_counter()
        log(
            {
                "step": 0,
                "eval_accuracy": evaluate(0),
                "seconds": {"eval": time.perf_counter() - tic},
            }
        )

    sampling = SamplingConfig(
        n=group,
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
    )
    for step in range(start, config.steps + 1):
        seconds: dict[str, float] = {}
        tic = time.perf_counter()

        # 1-2. this step's prompts, and G responses each from the current policy
        rows = step_prompt_indices(train_set.height, prompts_per_step, step, config.seed)
        batch = train_set[rows]
        batch_ids = batch["prompt_id"].to_list()
        policy.eval()
        rollouts = sample_rollouts(
            sampler, batch["problem"].to_list(), sampling, derive_seed(config.seed, step)
        )
        seconds["sample"] = time.perf_counter() - tic

        # 3. rewards r (B_p, G)
        tic = time.perf_counter()
        groups = [rollouts.responses[p * group : (p + 1) * group] for p in range(len(rows))]
        scored = score_many(groups, batch["answer"].to_list(), reward_config, pool)
        rewards = np.stack([r for r, _ in scored])
        seconds["reward"] = time.perf_counter() - tic

        # 4. baselines and advantages A = r - b (B_p, G)
        tic = time.perf_counter()
        baselines, beta, beta_index = baselines_of(batch_ids, rewards)
        raw_advantages = rewards - baselines
        advantages = normalise_advantages(raw_advantages, rewards, config.advantage_norm)
        seconds["estimate"] = time.perf_counter() - tic

        # 5. policy update over the step's N = B_p * G responses
        tic = time.perf_counter()
        prompt_tokens = [rollouts.prompt_tokens[p] for p in range(len(rows)) for _ in range(group)]
        responses = rollouts.response_tokens
        policy.train()  # no dropout in these models; train mode enables gradient checkpointing
        stats = update_policy(
            policy,
            optimizer,
            reference,
            prompt_tokens,
            responses,
            advantages.reshape(-1),
            config,
            np.random.default_rng([config.seed, step]),
            tokenizer.pad_token_id,
        )
        policy.eval()
        sync_sampler()
        seconds["update"] = time.perf_counter() - tic

        # log, store the rollouts, evaluate, checkpoint
        n = len(responses)
        n_tokens = [len(r) for r in responses]
        flat_ids = [pid for pid in batch_ids for _ in range(group)]
        statuses = [s for _, st in scored for s in st]
        write_parquet_atomic(
            rollout_frame(
                flat_ids,
                f"train-{step:06d}",
                rewards.reshape(-1),
                statuses,
                rollouts.responses,
                n_tokens,
                rollouts.finish_reasons,
            ),
            run_dir / "rollouts" / f"train-{step:06d}.parquet",
        )
        record: dict[str, Any] = {
            "step": step,
            "epoch": (step * prompts_per_step) / train_set.height,
            "prompts": len(rows),
            "rollouts": n,
            "mean_reward": float(rewards.mean()),
            "beta": beta,
            "beta_index": beta_index,
            "baseline_mean": float(baselines.mean()),
            "adv_mean": float(advantages.mean()),
            "adv_std": float(advantages.std()),
            "zero_adv_share": float(np.mean(np.abs(advantages) < 1e-9)),
            "response_tokens": int(sum(n_tokens)),
            "truncated_share": float(np.mean(np.asarray(rollouts.finish_reasons) == "length")),
            **stats,
        }
        if config.eval_every and (step % config.eval_every == 0 or step == config.steps):
            tic = time.perf_counter()
            record["eval_accuracy"] = evaluate(step)
            seconds["eval"] = time.perf_counter() - tic
        if config.checkpoint_every and (
            step % config.checkpoint_every == 0 or step == config.steps
        ):
            tic = time.perf_counter()
            checkpoint(step)
            seconds["checkpoint"] = time.perf_counter() - tic
        record["seconds"] = seconds
        log(record)
    if pool is not None:
        pool.shutdown()
    return run_dir
