"""BASIS in OpenRLHF: the baseline of its single-rollout estimator, ``flash_reinforce``.

OpenRLHF's estimators are a closed command-line list, each subtracting its baseline inline in
``RemoteExperienceMaker.compute_advantages_and_returns``; ``flash_reinforce``
(``n_samples_per_prompt=1``) subtracts the rollout batch's mean reward and does not whiten.
This plug-in puts BASIS's per-prompt baseline in place of that mean: r_i - b_i, b_i from
:class:`~basis_bench.estimators.Basis` with beta calibrated on the rollout batch, then the rest
of OpenRLHF's own function (length penalties, the KL term, returns) runs unchanged and leaves
A_i = r_i - b_i on the response tokens. The cache is keyed by the prompt exactly as OpenRLHF
renders it (``--data.input_template``, ``--data.apply_chat_template``), rendered by
OpenRLHF's own ``preprocess_data`` with the trainer's tokenizer.

OpenRLHF has no extension mechanism, and its trainer runs in a Ray actor, so the plug-in is
run as its launcher around ``openrlhf.cli.train_ppo_ray``, unchanged::

    python -m basis_bench.integrations.openrlhf --basis.rollouts DIR [--basis.KEY VALUE ...] \\
        --algo.advantage.estimator flash_reinforce --rollout.n_samples_per_prompt 1 ...

It checks the ``--basis.*`` options and builds the cache once (a mistake is one line, before
Ray starts), then runs OpenRLHF's own main with a Ray ``worker_process_setup_hook`` that
installs the hook in each Ray worker. OpenRLHF is imported only inside the functions.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators import StepEstimator
from basis_bench.integrations.keys import (
    DEFAULT_PROMPT_FORMAT,
    basis_from_rollouts,
    one_rollout_step,
    plugin_settings,
    prompt_key,
)

OPENRLHF_MAIN = "openrlhf.cli.train_ppo_ray"
OPENRLHF_RANGE = ">=0.11.2,<0.12"  # as pyproject's [openrlhf] extra; the hook is tested there
ESTIMATOR = "flash_reinforce"  # the OpenRLHF estimator whose baseline BASIS replaces
SETTINGS_ENV = "BASIS_OPENRLHF_SETTINGS"  # the checked --basis.* options, JSON, for the workers
SETUP_HOOK = f"{__name__}.setup_worker"
_NO_BASELINE = "basis"  # the estimator name OpenRLHF's function sees: no baseline, no whitening

Tensor = Any  # torch.Tensor; torch is imported by OpenRLHF, never here


def split_arguments(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--basis.KEY VALUE`` pairs (values read as JSON where they parse, else text) and the
    arguments left for OpenRLHF."""
    block: dict[str, Any] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if not arg.startswith("--basis."):
            rest.append(arg)
            continue
        key, eq, value = arg.removeprefix("--basis.").partition("=")
        if not eq:
            value = next(args, None)  # type: ignore[assignment]
            if value is None:
                raise InputError(f"--basis.{key} needs a value")
        try:
            block[key] = json.loads(value)
        except json.JSONDecodeError:
            block[key] = value
    return block, rest


def check_estimator(argv: Sequence[str]) -> None:
    """OpenRLHF must run ``flash_reinforce``, the estimator whose baseline BASIS replaces."""
    args = list(argv)
    flag = "--algo.advantage.estimator"
    given = [a.partition("=")[2] for a in args if a.startswith(flag + "=")]
    given += [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    if given[-1:] != [ESTIMATOR]:
        raise InputError(
            f"pass {flag} {ESTIMATOR} (OpenRLHF's single-rollout estimator): BASIS replaces "
            f"its batch-mean baseline; got {given[-1] if given else 'the default, gae'}"
        )


def basis_baselines(basis: StepEstimator, prompts: Sequence[str], rewards: Tensor) -> Tensor:
    """BASIS's b (B,) for a rollout batch: ``prompts`` as OpenRLHF rendered them, ``rewards`` (B,)."""
    out = one_rollout_step(basis, [prompt_key(p) for p in prompts], rewards.double().cpu().numpy())
    return rewards.new_tensor(out.baselines)


def renderer(maker: Any, prompt_format: str) -> Callable[[Mapping[str, Any]], str]:
    """A cache row -> the prompt text as OpenRLHF's dataset renders it for this trainer."""
    from openrlhf.datasets.prompts_dataset import preprocess_data

    data = maker.strategy.args.data
    template = maker.tokenizer.apply_chat_template if data.apply_chat_template else None

    def render(row: Mapping[str, Any]) -> str:
        text = prompt_format.format(**row)
        return str(
            preprocess_data({"input": text}, data.input_template, "input", None, template)[0]
        )

    return render


def _with_basis(method: Callable[[Any, list[Any]], list[Any]], options: dict[str, Any]) -> Any:
    basis: dict[int, StepEstimator] = {}  # per experience maker (one per trainer)

    def compute_advantages_and_returns(self: Any, experiences: list[Any]) -> list[Any]:
        if self.advantage_estimator != ESTIMATOR:
            return method(self, experiences)
        if id(self) not in basis:
            opts = dict(options)
            render = renderer(self, opts.pop("prompt_format", DEFAULT_PROMPT_FORMAT))
            basis[id(self)] = basis_from_rollouts(prompt_format=render, **opts)
        import torch

        rewards = torch.cat([e.rewards for e in experiences])
        prompts = [p for e in experiences for p in e.prompts]
        baselines = basis_baselines(basis[id(self)], prompts, rewards).split(
            [len(e.rewards) for e in experiences]
        )
        for e, b in zip(experiences, baselines, strict=True):
            e.rewards = e.rewards - b
        args = self.strategy.args.algo.advantage
        args.estimator = _NO_BASELINE  # OpenRLHF's function: no baseline and no whitening
        try:
            out = method(self, experiences)
        finally:
            args.estimator = ESTIMATOR
        for e, b in zip(experiences, baselines, strict=True):
            if "reward" in e.info:  # OpenRLHF logs the shaped reward there: log the reward
                e.info["reward"] = e.info["reward"] + b
        return out

    compute_advantages_and_returns.__basis_hook__ = True  # type: ignore[attr-defined]
    compute_advantages_and_returns.__wrapped__ = method  # type: ignore[attr-defined]
    return compute_advantages_and_returns


def install(options: Mapping[str, Any]) -> None:
    """Hook OpenRLHF's experience maker with BASIS on the cache ``options`` name (idempotent)."""
    from importlib.metadata import version

    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
    from packaging.specifiers import SpecifierSet

    found = version("openrlhf")
    if found not in SpecifierSet(OPENRLHF_RANGE):
        raise InputError(f"the BASIS hook is tested on openrlhf{OPENRLHF_RANGE}; found {found}")

    method = RemoteExperienceMaker.compute_advantages_and_returns
    method = getattr(method, "__wrapped__", method)
    RemoteExperienceMaker.compute_advantages_and_returns = _with_basis(method, dict(options))


def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: install in each worker the launcher started."""
    if os.environ.get(SETTINGS_ENV):
        install(json.loads(os.environ[SETTINGS_ENV]))


def _ray_init_with_hook(init: Callable[..., Any], settings: str) -> Callable[..., Any]:
    def ray_init(*args: Any, runtime_env: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        env = dict(runtime_env or {})
        env["worker_process_setup_hook"] = SETUP_HOOK
        env["env_vars"] = {**env.get("env_vars", {}), SETTINGS_ENV: settings}
        return init(*args, runtime_env=env, **kwargs)

    return ray_init


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m basis_bench.integrations.openrlhf --basis.rollouts DIR [OpenRLHF args]``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        block, rest = split_arguments(argv)
        options = plugin_settings(block, "--basis.{} VALUE")
        check_estimator(rest)
        basis_from_rollouts(**options)  # the cache reads and the options hold, before Ray starts
    except InputError as exc:
        raise SystemExit(f"error: {exc}") from None
    import ray

    settings = json.dumps(options)
    os.environ[SETTINGS_ENV] = settings
    ray.init = _ray_init_with_hook(ray.init, settings)
    sys.argv = [OPENRLHF_MAIN, *rest]
    runpy.run_module(OPENRLHF_MAIN, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
