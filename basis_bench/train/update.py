"""The policy update of one step: token log-probabilities of the sampled responses, then
``epochs`` x ``minibatches`` AdamW steps on a registered policy loss (+ the k3 KL).

A step whose loss, gradient norm or weights are not finite stops the run with
:class:`NonFiniteError` before the bad values reach a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.rollouts.logits import response_logits
from basis_bench.train.config import TrainConfig


class NonFiniteError(InputError):
    """The loss, the gradient or the weights went NaN or infinite; the run stops."""


def _gather_logprobs(logits: Any, targets: Any) -> Any:
    return logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1)


def token_logprobs(
    model: Any,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[np.ndarray],
    pad_id: int,
    temperature: float,
    autocast: str = "none",
) -> tuple[Any, Any]:
    """log pi(y_t | x, y_<t) of each sampled response token: (N, T) and its mask (N, T)
    (the logits as :func:`response_logits` gives them)."""
    logits, targets, mask = response_logits(
        model, prompts, responses, pad_id, temperature, autocast
    )
    return _gather_logprobs(logits, targets), mask


def token_entropy(logits: Any) -> Any:
    """The entropy of each position's next-token distribution, softmax(logits), in nats
    (no gradient): (N, T) from (N, T, V), one response at a time, so that its temporaries
    stay a response's (T, V) rather than the micro-batch's."""
    import torch

    with torch.no_grad():
        return torch.stack(
            [row.logsumexp(-1) - (torch.softmax(row, -1) * row).sum(-1) for row in logits]
        )


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
                config.generation.temperature,
                config.autocast,
            )
            out[idx, : logp.shape[1]] = logp
    return out


def _check_finite(step: int, what: str, value: float) -> None:
    if not math.isfinite(value):
        raise NonFiniteError(
            f"step {step}: the {what} is {value}; the run stops before the optimizer step, "
            "so the weights and checkpoints stay finite (a smaller lr or max_grad_norm, or "
            "autocast = none, usually helps)"
        )


def _check_weights(step: int, policy: Any) -> None:
    import torch

    finite = torch.stack([torch.isfinite(p).all() for p in policy.parameters()]).all()
    if not bool(finite):
        raise NonFiniteError(
            f"step {step}: the optimizer step left non-finite weights; the run stops before "
            "they reach a checkpoint (a smaller lr usually helps)"
        )


@dataclass
class UpdateBatch:
    """The step's N responses as the loss sees them, with the fixed log-probs: sampling-time
    (``old_logp``, only when the policy moves within the step) and the reference's (only
    with a KL term), both (N, T_max)."""

    prompt_tokens: Sequence[Sequence[int]]  # per response
    responses: Sequence[np.ndarray]
    advantages: Any  # (N,) tensor on the policy's device
    pad_id: int
    old_logp: Any = None
    ref_logp: Any = None


def _minibatch_step(
    policy: Any,
    batch: UpdateBatch,
    minibatch: np.ndarray,
    config: TrainConfig,
    step: int,
    entropy: list[tuple[float, float]] | None = None,
) -> tuple[float, float, float]:
    """The gradient of one minibatch, accumulated over micro-batches with the minibatch's
    denominator, then clipped. Returns (loss, KL, gradient norm before clipping); with an
    ``entropy`` list, appends the policy's per-token entropy summed over the minibatch's
    response tokens and their count."""
    import torch

    from basis_bench.train import losses

    policy_loss = losses.POLICY_LOSSES.get(config.loss)
    settings = losses.LossSettings(
        policy_loss.aggregation(config.loss_agg),  # type: ignore[arg-type]
        config.clip_low,
        config.clip_high,
    )
    lengths = [len(batch.responses[i]) for i in minibatch]
    denom = float(sum(lengths)) if settings.agg == "token_mean" else float(len(minibatch))
    total = kl_total = 0.0
    for part in np.array_split(minibatch, -(-len(minibatch) // config.micro_batch_size)):
        logits, targets, mask = response_logits(
            policy,
            [batch.prompt_tokens[i] for i in part],
            [batch.responses[i] for i in part],
            batch.pad_id,
            config.generation.temperature,
            config.autocast,
        )
        logp = _gather_logprobs(logits, targets)
        if entropy is not None:
            entropy.append((float((token_entropy(logits) * mask).sum()), float(mask.sum())))
        width = logp.shape[1]
        old = batch.old_logp[part, :width] if batch.old_logp is not None else logp.detach()
        loss = policy_loss.fn(logp, old, batch.advantages[part], mask, settings, denom)
        if batch.ref_logp is not None:
            kl = losses.kl_k3(logp, batch.ref_logp[part, :width], mask, settings.agg, denom)
            loss = loss + config.kl_coef * kl
            kl_total += float(kl.detach())
        loss.backward()
        total += float(loss.detach())
    _check_finite(step, "loss", total)
    norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm))
    _check_finite(step, "gradient norm", norm)
    return total, kl_total, norm


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
    step: int = 0,
) -> dict[str, float | None]:
    """``epochs`` passes over ``minibatches`` shuffled minibatches of the N responses, one
    AdamW step each on loss + kl_coef * KL, the gradient accumulated over micro-batches
    with the minibatch's denominator (so micro-batching never changes the step).

    Returns the mean loss, KL and gradient norm over the updates, and ``entropy``: the mean
    over the responses' tokens of the policy's next-token entropy (nats, at the sampling
    temperature), taken in the first epoch's pass (the sampling policy itself at the first
    minibatch; later minibatches see the policy their predecessors updated).
    """
    import torch

    # Sampling-time log-probs are needed once the policy moves within the step; for a single
    # update they equal the detached current ones (the ratio is exactly 1).
    several = config.epochs * config.minibatches > 1
    batch = UpdateBatch(
        prompt_tokens,
        responses,
        torch.as_tensor(advantages, dtype=torch.float32, device=policy.device),
        pad_id,
        frozen_logprobs(policy, prompt_tokens, responses, config, pad_id) if several else None,
        frozen_logprobs(reference, prompt_tokens, responses, config, pad_id)
        if reference is not None
        else None,
    )
    totals: list[float] = []
    kls: list[float] = []
    norms: list[float] = []
    entropy: list[tuple[float, float]] = []  # (sum, tokens) per micro-batch of the first epoch
    for epoch in range(config.epochs):
        for minibatch in np.array_split(rng.permutation(len(responses)), config.minibatches):
            optimizer.zero_grad(set_to_none=True)
            total, kl_total, norm = _minibatch_step(
                policy, batch, minibatch, config, step, entropy if epoch == 0 else None
            )
            optimizer.step()
            _check_weights(step, policy)
            totals.append(total)
            kls.append(kl_total)
            norms.append(norm)
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": float(np.mean(totals)),
        "kl": float(np.mean(kls)) if reference is not None else None,
        "grad_norm": float(np.mean(norms)),
        "entropy": sum(e for e, _ in entropy) / max(1.0, sum(n for _, n in entropy)),
    }
