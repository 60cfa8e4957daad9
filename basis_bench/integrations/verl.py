"""BASIS as a verl advantage estimator: ``algorithm.adv_estimator=basis``, one rollout per prompt.

verl calls a registered advantage function with ``token_level_rewards`` and ``response_mask``
(bs, L), the algorithm ``config`` and ``index`` = the batch's ``uid``: a fresh uuid per prompt
and step, which says nothing about which prompt it is. The adapter therefore remembers
uid -> prompt key where verl assigns the uid while the chat prompt (``raw_prompt``) is still in
the batch (``RayPPOTrainer._get_gen_batch`` in the legacy trainer,
``PPOTrainer._fetch_one_gen_batch`` in the V1 trainer) and looks the keys up when verl calls
the registered function. Keys are content hashes (:func:`basis_bench.integrations.prompt_key`),
so the same prompt meets its cache row in any step and any batch order.

Each step: r_i = sum_t token_level_rewards[i, t] (the outcome reward), b_i from
:class:`~basis_bench.estimators.Basis` (beta calibrated on this batch), A_i = r_i - b_i
broadcast over the response mask, returned as both advantages and returns, as verl's outcome
estimators do. Run verl through ``python -m basis_bench.integrations.verl`` with verl's usual
overrides plus::

    algorithm.adv_estimator=basis actor_rollout_ref.rollout.n=1 \\
    +basis.rollouts=DIR [+basis.reference=reference +basis.ref_n=64 \\
    +basis.prompt_format='{problem}' +basis.calibration=current]

verl is imported only inside the functions that need it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators import BasisOptions, StepEstimator, StepOutput
from basis_bench.estimators.basis import BASIS_NAME
from basis_bench.estimators.options import field_names
from basis_bench.integrations.keys import (
    DEFAULT_PROMPT_FORMAT,
    CacheStep,
    basis_from_rollouts,
    one_rollout_step,
    prompt_key,
)
from basis_bench.integrations.prompt_check import check_parquet_prompts

ESTIMATOR_NAME = BASIS_NAME  # also the name verl's registry knows it by
CONFIG_KEY = "basis"  # the +basis.* block of the verl config
# Every field of BasisOptions, plus the tilt table's prior: the list is written once, there.
BASIS_OPTIONS = (*field_names(BasisOptions), "prior")

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
                "records them; start verl with `python -m basis_bench.integrations.verl` (or call "
                "install()) in the process that runs the trainer, and keep raw_prompt in the data"
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


_ACTIVE: BasisVerl | None = None


def compute_basis_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Sequence[Any] | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """The function registered under ``basis``: delegates to the installed :class:`BasisVerl`."""
    if _ACTIVE is None:
        raise InputError("the basis advantage estimator is not installed; call install() first")
    return _ACTIVE(token_level_rewards, response_mask, index=index, config=config, **kwargs)


def _rows(value: Any) -> list[Any]:
    return list(
        value.tolist() if hasattr(value, "tolist") and not hasattr(value, "keys") else value
    )


def _wrap_get_gen_batch(method: Any) -> Any:
    def get_gen_batch(self: Any, batch: Any) -> Any:
        nt = batch.non_tensor_batch
        if _ACTIVE is not None and "uid" in nt:
            if "raw_prompt" not in nt:
                raise InputError("the batch has no raw_prompt to key the BASIS cache by")
            _ACTIVE.remember(_rows(nt["uid"]), _rows(nt["raw_prompt"]))
        return method(self, batch)

    get_gen_batch.__basis_wrapped__ = True  # type: ignore[attr-defined]
    return get_gen_batch


def _wrap_fetch_one_gen_batch(method: Any) -> Any:
    def fetch_one_gen_batch(self: Any) -> Any:
        td = method(self)
        if _ACTIVE is not None:
            _ACTIVE.remember(list(td["uid"]), list(td["raw_prompt"]))
        return td

    fetch_one_gen_batch.__basis_wrapped__ = True  # type: ignore[attr-defined]
    return fetch_one_gen_batch


def install(adapter: BasisVerl) -> None:
    """Register ``basis`` with verl and hook the trainers that assign uids (idempotent).

    Call it in the process that runs the trainer (verl's TaskRunner actor), before the
    trainer starts; :func:`main` does so.
    """
    global _ACTIVE
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    _ACTIVE = adapter
    core_algos.register_adv_est(ESTIMATOR_NAME)(compute_basis_outcome_advantage)
    if not getattr(RayPPOTrainer._get_gen_batch, "__basis_wrapped__", False):
        RayPPOTrainer._get_gen_batch = _wrap_get_gen_batch(RayPPOTrainer._get_gen_batch)
    try:  # the V1 trainer needs the optional TransferQueue package
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    except ImportError:
        return
    if not getattr(PPOTrainer._fetch_one_gen_batch, "__basis_wrapped__", False):
        PPOTrainer._fetch_one_gen_batch = _wrap_fetch_one_gen_batch(PPOTrainer._fetch_one_gen_batch)


def settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of :meth:`BasisVerl.from_rollouts` from the config's ``basis`` block."""
    block = config.get(CONFIG_KEY) if hasattr(config, "get") else None
    if not block or not block.get("rollouts"):
        raise InputError(
            "the basis estimator needs its reference cache: add +basis.rollouts=DIR "
            "(a rollouts directory in basis-bench's schema, with prompts.parquet)"
        )
    known = {"rollouts", "reference", "ref_n", "prompt_format", "estimator", *BASIS_OPTIONS}
    if block.get("estimator", BASIS_NAME) != BASIS_NAME:  # another estimator: its own options
        from basis_bench.estimators import get

        known = {"rollouts", "reference", "ref_n", "prompt_format", "estimator"}
        known |= set(field_names(get(block["estimator"]).options_class))
        if get(block["estimator"]).uses_features:
            known.add("features")
    unknown = sorted(set(block) - known)
    if unknown:
        raise InputError(f"unknown basis option(s) {unknown}; known: {sorted(known)}")
    return {k: block[k] for k in block}


def _runner_class(base: Any) -> Any:
    """verl's TaskRunner with the adapter installed in its own process before training."""
    original = getattr(base, "__ray_actor_class__", base)

    class BasisTaskRunner(original):  # type: ignore[misc, valid-type]
        def run(self, config: Any) -> Any:
            install(BasisVerl.from_rollouts(**settings(config)))
            return super().run(config)

    return BasisTaskRunner


def main() -> None:
    """``python -m basis_bench.integrations.verl [verl overrides]``: verl's PPO with BASIS."""
    from pathlib import Path

    import hydra
    import ray
    from verl.trainer import main_ppo

    config_dir = str(Path(main_ppo.__file__).parent / "config")

    @hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)
    def run(config: Any) -> None:
        try:  # a user mistake ends here, in the driver, as one line
            opts = settings(config)
            if config.algorithm.adv_estimator != ESTIMATOR_NAME:
                raise InputError(
                    f"set algorithm.adv_estimator={ESTIMATOR_NAME} to train with BASIS"
                )
            adapter = BasisVerl.from_rollouts(**opts)
            if isinstance(adapter.basis, CacheStep):  # every training prompt, before any load
                check_parquet_prompts(
                    adapter.basis.cached,
                    config.data.train_files,
                    config.data.get("prompt_key", "prompt"),
                )
        except InputError as exc:
            raise SystemExit(f"error: {exc}") from None
        main_ppo.auto_set_device(config)
        main_ppo.validate_config(
            config=config,
            use_reference_policy=main_ppo.need_reference_policy(config),
            use_critic=main_ppo.need_critic(config),
        )
        base: Any = main_ppo.TaskRunnerV1
        if not config.trainer.get("use_v1", False):
            from verl.trainer.main_ppo_v0 import TaskRunner

            base = TaskRunner
        runner = ray.remote(num_cpus=1)(_runner_class(base))
        main_ppo.run_ppo(config, task_runner_class=runner)

    run()


if __name__ == "__main__":
    main()
