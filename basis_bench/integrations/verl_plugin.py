"""basis-bench's verl plug-in, loaded by verl's own extension mechanism::

    VERL_USE_EXTERNAL_MODULES=basis_bench.integrations.verl_plugin \\
        python -m verl.trainer.main_ppo algorithm.adv_estimator=basis +basis.rollouts=DIR ...

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` when it is itself imported,
in every process (the driver, the TaskRunner that runs the trainer, the workers), so
``verl.trainer.main_ppo`` and recipe mains run unchanged. Importing this module registers
``basis`` with ``register_adv_est`` and hooks verl's current trainer (the V1 ``PPOTrainer``,
``trainer.use_v1=true``, verl's default) at two methods, after verl's own code:

- ``_init_dataloader``: the trainer's config is there and no model is loaded yet, so the
  cache is built from ``+basis.*`` here and a mistake stops the run before the GPUs start;
- ``_fetch_one_gen_batch``: where verl assigns the uids while ``raw_prompt`` is still in the
  batch, so each uid's prompt key is remembered for the advantage call.

Both do nothing unless ``algorithm.adv_estimator=basis``. verl's legacy trainer is not
touched: a run on it stops at the first advantage call with a line naming ``trainer.use_v1``.
The hooks are pinned to :data:`VERL_RANGE`, the range the ``[verl]`` extra installs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import verl
from packaging.specifiers import SpecifierSet
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1.trainer_base import PPOTrainer

from basis_bench.errors import InputError
from basis_bench.integrations.keys import CacheStep
from basis_bench.integrations.prompt_check import check_parquet_prompts
from basis_bench.integrations.verl import (
    ESTIMATOR_NAME,
    PLUGIN_MODULE,
    BasisVerl,
    Tensor,
    settings,
)

VERL_RANGE = SpecifierSet(">=0.9,<0.10")  # as pyproject's [verl] extra; the hooks are tested there

if verl.__version__ not in VERL_RANGE:
    raise ImportError(
        f"{PLUGIN_MODULE} hooks verl{VERL_RANGE} and this is verl {verl.__version__}: "
        "install basis-bench[verl], or drop it from VERL_USE_EXTERNAL_MODULES"
    )

_active: BasisVerl | None = None  # the trainer's adapter, in the process that runs the trainer


def compute_basis_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Sequence[Any] | None = None,
    config: Any = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor]:
    """The function registered under ``basis``: the trainer's :class:`BasisVerl`."""
    if _active is None:
        raise InputError(
            "the basis estimator has no cache in this process: it runs on verl's V1 trainer "
            f"(trainer.use_v1=true, the default) with VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE}"
        )
    return _active(token_level_rewards, response_mask, index=index, config=config, **kwargs)


def _uses_basis(trainer: Any) -> bool:
    return bool(trainer.config.algorithm.adv_estimator == ESTIMATOR_NAME)


def _after_init_dataloader(method: Callable[[Any], None]) -> Callable[[Any], None]:
    def _init_dataloader(self: Any) -> None:
        method(self)
        global _active
        if _uses_basis(self):
            opts = settings(self.config)
            _active = BasisVerl.from_rollouts(**opts)
            if isinstance(_active.basis, CacheStep):  # every training prompt, before any load
                data = self.config.data
                check_parquet_prompts(
                    _active.basis.cached, data.train_files, data.get("prompt_key", "prompt")
                )
            print(f"basis-bench: advantage estimator basis, reference cache {opts['rollouts']}")

    return _init_dataloader


def _after_fetch_one_gen_batch(method: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def _fetch_one_gen_batch(self: Any) -> Any:
        batch = method(self)
        if _uses_basis(self):
            if _active is None:  # a trainer subclass that builds its dataloader elsewhere
                raise InputError("the basis estimator's cache was not built: no _init_dataloader")
            _active.remember(list(batch["uid"]), list(batch["raw_prompt"]))
        return batch

    return _fetch_one_gen_batch


def _hook(cls: type, name: str, wrap: Callable[[Any], Any]) -> None:
    hooked = wrap(getattr(cls, name))
    hooked.__wrapped__ = getattr(cls, name)
    setattr(cls, name, hooked)


# verl imports this module once per process (import_external_libs), so each hook is set once.
core_algos.register_adv_est(ESTIMATOR_NAME)(compute_basis_outcome_advantage)
_hook(PPOTrainer, "_init_dataloader", _after_init_dataloader)
_hook(PPOTrainer, "_fetch_one_gen_batch", _after_fetch_one_gen_batch)
