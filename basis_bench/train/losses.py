"""The three policy losses of the training loop, and the k3 KL penalty.

Shapes: N sampled responses, T response tokens (right-padded). ``logp`` (N, T) are the
current policy's log-probabilities of the sampled tokens, ``old_logp`` (N, T) the same
under the policy that sampled them (the sampling-time policy, no gradient), ``mask``
(N, T) is 1 on response tokens and 0 on padding (prompt tokens never enter these
tensors), ``advantages`` (N,) one per response.

Token terms are reduced by :func:`reduce` with one of two rules:

    token_mean: sum_{i,t} m_it x_it / D,  D = sum_{i,t} m_it (all tokens weigh the same)
    seq_mean:   sum_i [sum_t m_it x_it / sum_t m_it] / D,  D = N (all responses weigh the same)

``denominator`` overrides D: a minibatch split into micro-batches passes the whole
minibatch's D to every micro-batch, so the accumulated gradient is the minibatch's.

The training loop picks its loss by name from :data:`POLICY_LOSSES`, a
:class:`~basis_bench.registry.Registry` in the style of verl's policy-loss registry; every
entry has one signature, ``loss(logp, old_logp, advantages, mask, settings, denom)``. Add
your own with::

    @register_policy_loss("my_loss")
    def my_loss(logp, old_logp, advantages, mask, settings: LossSettings, denom): ...

and select it with ``loss = "my_loss"``; a separate package registers through the entry
point group ``basis_bench.policy_losses``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from basis_bench.registry import Registry

Aggregation = Literal["token_mean", "seq_mean"]
AGGREGATIONS: tuple[Aggregation, ...] = ("token_mean", "seq_mean")


def denominator(mask: torch.Tensor, agg: Aggregation) -> float:
    """D of :func:`reduce` for these responses: their token count or their number."""
    return float(mask.sum()) if agg == "token_mean" else float(mask.shape[0])


def zero_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with 0 where ``mask`` is 0: padding's terms, finite or not, never enter."""
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """PPO's objective term min(rho A, clip(rho, 1 - clip_low, 1 + clip_high) A), elementwise
    (per token in GRPO, per response in GSPO)."""
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.minimum(ratio * advantages, clipped * advantages)


def reduce(
    values: torch.Tensor, mask: torch.Tensor, agg: Aggregation, denom: float | None = None
) -> torch.Tensor:
    """Masked mean of token terms (N, T) by ``agg`` (see the module docstring).

    Padding never enters, even when its terms are not finite.
    """
    masked = zero_padding(values, mask)
    if agg == "token_mean":
        total = masked.sum()
    elif agg == "seq_mean":
        total = (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    else:
        raise ValueError(f"agg must be one of {AGGREGATIONS}, got {agg!r}")
    return total / (denominator(mask, agg) if denom is None else denom)


def gpg_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    agg: Aggregation = "token_mean",
    denom: float | None = None,
) -> torch.Tensor:
    """Plain policy gradient (GPG, REINFORCE): L = -reduce_{i,t}(A_i log pi(y_it | x_i, y_i<t)).

    No ratio and no clipping; its gradient is -reduce(A_i grad log pi).
    """
    return -reduce(advantages[:, None] * logp, mask, agg, denom)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: Aggregation = "token_mean",
    denom: float | None = None,
) -> torch.Tensor:
    """PPO clip with a per-token ratio (GRPO):

        rho_it = exp(logp_it - old_logp_it)
        L = -reduce_{i,t}( min(rho_it A_i, clip(rho_it, 1 - clip_low, 1 + clip_high) A_i) )

    At rho = 1 (the first update on fresh samples) the gradient equals :func:`gpg_loss`'s;
    over several epochs or minibatches the clip stops a token's ratio from moving further
    in the direction its advantage favours.
    """
    ratio = torch.exp(zero_padding(logp - old_logp, mask))
    terms = clipped_surrogate(ratio, advantages[:, None], clip_low, clip_high)
    return -reduce(terms, mask, agg, denom)


def gspo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    denom: float | None = None,
) -> torch.Tensor:
    """PPO clip with a sequence-level ratio (GSPO):

        s_i = exp( sum_t m_it (logp_it - old_logp_it) / sum_t m_it )   (geometric mean ratio)
        L = -(1/D) sum_i min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i),  D = N

    The whole response is clipped or not; GSPO's ranges are small (defaults from its paper).
    """
    length = mask.sum(-1).clamp(min=1)
    ratio = torch.exp(zero_padding(logp - old_logp, mask).sum(-1) / length)
    terms = clipped_surrogate(ratio, advantages, clip_low, clip_high)
    return -terms.sum() / (denominator(mask, "seq_mean") if denom is None else denom)


def kl_k3(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    agg: Aggregation = "token_mean",
    denom: float | None = None,
) -> torch.Tensor:
    """KL(pi || pi_ref) by Schulman's k3 estimator on the sampled tokens:

        k3_it = exp(ref_logp_it - logp_it) - (ref_logp_it - logp_it) - 1  >= 0

    unbiased for the KL when y ~ pi, and never negative (unlike the plain log-ratio). Written
    expm1(x) - x, clamped at 0: exp(x) - x - 1 cancels catastrophically in float32 for small
    x and came out at -6e-8 for x = -6e-8.
    """
    log_ratio = ref_logp - logp
    return reduce((torch.expm1(log_ratio) - log_ratio).clamp(min=0.0), mask, agg, denom)


# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class LossSettings:
    """The loss settings of a run: the aggregation and the PPO clip range."""

    agg: Aggregation = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2


PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossSettings, "float | None"],
    torch.Tensor,
]


@dataclass(frozen=True)
class PolicyLoss:
    """A registered policy loss; ``agg`` fixes its aggregation (None: the run's ``loss_agg``)."""

    name: str
    fn: PolicyLossFn
    agg: Aggregation | None = None

    def aggregation(self, configured: Aggregation) -> Aggregation:
        """The aggregation this loss uses when the run asks for ``configured``."""
        return configured if self.agg is None else self.agg


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "basis_bench.policy_losses")


def register_policy_loss(
    name: str, *, agg: Aggregation | None = None
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register ``fn(logp, old_logp, advantages, mask, settings, denom)`` as ``name``.

    ``agg`` fixes the aggregation whatever the run's ``loss_agg`` (GSPO: per sequence).
    """

    def wrap(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.add(name, PolicyLoss(name, fn, agg))
        return fn

    return wrap


@register_policy_loss("gpg")
def _gpg(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    denom: float | None = None,
) -> torch.Tensor:
    """Plain policy gradient (the sampling-time log-probs are not needed)."""
    return gpg_loss(logp, advantages, mask, settings.agg, denom)


@register_policy_loss("grpo")
def _grpo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    denom: float | None = None,
) -> torch.Tensor:
    """PPO clip with a per-token ratio."""
    return grpo_loss(
        logp, old_logp, advantages, mask, settings.clip_low, settings.clip_high, settings.agg, denom
    )


@register_policy_loss("gspo", agg="seq_mean")
def _gspo(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings,
    denom: float | None = None,
) -> torch.Tensor:
    """PPO clip with a sequence-level ratio (always per sequence)."""
    return gspo_loss(logp, old_logp, advantages, mask, settings.clip_low, settings.clip_high, denom)
