"""BASIS as a verl advantage estimator: ``algorithm.adv_estimator=basis``, one rollout per prompt.

verl calls a registered advantage function with ``token_level_rewards`` and ``response_mask``
(bs, L), the algorithm ``config`` and ``index`` = the batch's ``uid``: a fresh uuid per prompt
and step, which says nothing about which prompt it is. :class:`BasisVerl` therefore remembers
uid -> prompt key while the chat prompt (``raw_prompt``) is still in the batch and looks the
keys up when verl calls it. Keys are content hashes (:func:`basis_bench.integrations.prompt_key`),
so the same prompt meets its cache row in any step and any batch order.

Each step: r_i = sum_t token_level_rewards[i, t] (the outcome reward), b_i from
:class:`~basis_bench.estimators.Basis` (beta calibrated on this batch), A_i = r_i - b_i
broadcast over the response mask, returned as both advantages and returns, as verl's outcome
estimators do. verl loads it through :mod:`basis_bench.integrations.verl_plugin`; this module
never imports verl.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators import StepEstimator, StepOutput
from basis_bench.estimators.basis import BASIS_NAME
from basis_bench.integrations.keys import (
    DEFAULT_PROMPT_FORMAT,
    basis_from_rollouts,
    one_rollout_step,
    plugin_settings,
    prompt_key,
)

ESTIMATOR_NAME = BASIS_NAME  # also the name verl's registry knows it by
CONFIG_KEY = "basis"  # the +basis.* block of the verl config
PLUGIN_MODULE = "basis_bench.integrations.verl_plugin"  # what VERL_USE_EXTERNAL_MODULES names

Tensor = Any  # torch.Tensor; torch is imported by verl, never here


def sequence_rewards(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """Outcome reward per sequence, (bs, L) -> (bs,): the masked sum of the token rewards."""
    return (token_level_rewards * response_mask).sum(dim=-1)


def broadcast_advantages(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """One advantage per sequence, (bs,) -> (bs, L): repeated on response tokens, 0 elsewhere."""
    return advantages.unsqueeze(-1) * response_mask


@dataclass
class BasisVerl:
    """The state verl's advantage function needs: the cache and the uid -> prompt-key memo."""

    basis: StepEstimator  # +basis.estimator=basis_memory: another one, its state carried
    keys: dict[str, str] = field(default_factory=dict)
    last: StepOutput | None = None

    @classmethod
    def from_rollouts(
        cls,
        rollouts: str | os.PathLike[str],
        reference: str = "reference",
        ref_n: int | None = None,
        prompt_format: str = DEFAULT_PROMPT_FORMAT,
        **basis_options: Any,
    ) -> BasisVerl:
        """Cache from a rollouts directory in basis-bench's schema (see keyed_reference_cache)."""
        return cls(basis_from_rollouts(rollouts, reference, ref_n, prompt_format, **basis_options))

    def remember(self, uids: Iterable[Any], raw_prompts: Iterable[Any]) -> None:
        """Record the prompt key of each uid of a fresh batch (before generation)."""
        uids, raw_prompts = list(uids), list(raw_prompts)
        if len(uids) != len(raw_prompts):
            raise InputError(f"{len(uids)} uids but {len(raw_prompts)} prompts")
        self.keys.update({str(u): prompt_key(p) for u, p in zip(uids, raw_prompts, strict=True)})

    def prompt_keys(self, index: Sequence[Any]) -> list[str]:
        """Prompt keys of a batch's uids; a uid never remembered is an error that says why."""
        try:
            return [self.keys[str(u)] for u in index]
        except KeyError as exc:
            raise InputError(
                f"uid {exc.args[0]!r} has no prompt key: the batch never passed the hook that "
                "records them; run verl's V1 trainer (trainer.use_v1=true, the default) with "
                f"VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE}, and keep raw_prompt in the data"
            ) from None

    def advantages(
        self, token_level_rewards: Tensor, response_mask: Tensor, keys: Sequence[str]
    ) -> tuple[Tensor, Tensor]:
        """(advantages, returns), both (bs, L), for a batch whose prompts have ``keys``."""
        rewards = sequence_rewards(token_level_rewards, response_mask)
        self.last = one_rollout_step(self.basis, keys, rewards)
        adv = broadcast_advantages(rewards - self.last.baselines, response_mask)
        return adv, adv

    def __call__(
        self,
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: Sequence[Any] | None = None,
        config: Any = None,
        **_: Any,
    ) -> tuple[Tensor, Tensor]:
        """verl's advantage-function signature; ``index`` is the batch's uid array."""
        if index is None:
            raise InputError("verl passed no uid index; the basis estimator needs one per row")
        out = self.advantages(token_level_rewards, response_mask, self.prompt_keys(index))
        for u in set(map(str, index)):
            self.keys.pop(u, None)
        return out


def settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :meth:`BasisVerl.from_rollouts` from the config's ``basis`` block."""
    block = config.get(CONFIG_KEY) if hasattr(config, "get") else None
    return plugin_settings(block or {}, "+basis.{}=VALUE")
