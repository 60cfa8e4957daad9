"""Name -> estimator registry, in the style of verl's advantage-estimator registry.

Every registered estimator is a step-kernel factory (:mod:`basis_bench.estimators.kernel`),
so the benchmark, trajectory replay and the training loop run them alike. One registered
with a one-step function also has the uniform call ``est(batch, options)``, mapping an
:class:`EstimatorInput` to baselines of shape (..., B, G), one per rollout, and its kernel
is that call (:class:`~basis_bench.estimators.kernel.StatelessKernel`). ``options`` is an
instance of the estimator's own options dataclass (:mod:`basis_bench.estimators.options`),
never another estimator's. Register your own with::

    @register_estimator("my_baseline", uses_cache=True, options=MyOptions)
    def my_baseline(batch: EstimatorInput, options: MyOptions) -> Array: ...

or, for an estimator that carries state across steps, with its kernel alone::

    register_estimator("my_tracker", uses_cache=True, options=MyOptions, kernel=MyKernel)

:data:`ESTIMATORS` is a :class:`~basis_bench.registry.Registry`, the idiom of every
extension point: it holds no estimators of its own (each module of the package registers
its estimators when imported; ``basis_bench.estimators`` imports them all), and third-party
packages join through the entry point group ``basis_bench.estimators`` (see
:func:`load_plugins`). How figures draw an estimator (its label and colour) is the figures'
business: :mod:`basis_bench.evaluation.figure_style`. ``Estimator.__call__`` validates the
input once; the registered function may trust it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, RewardRange, as_rewards, check_rewards
from basis_bench.estimators.kernel import EstimatorInput, StatelessKernel, StepKernel
from basis_bench.estimators.options import NoOptions, as_dict, options_from_mapping
from basis_bench.registry import Registry

ENTRY_POINT_GROUP = "basis_bench.estimators"


EstimatorFn = Callable[[EstimatorInput, Any], Array]
# ``factory(estimator, options, table, ref_rewards, reward_range)`` -> the estimator's kernel.
KernelFactory = Callable[..., StepKernel]


@dataclass(frozen=True)
class Estimator:
    """A registered value estimator: its kernel factory, its one-step function (None for a
    stateful estimator), what data it needs and its options."""

    name: str
    fn: EstimatorFn | None
    group: bool
    uses_cache: bool
    description: str
    options_class: type = NoOptions
    default_options: Any = field(default_factory=NoOptions)
    # ``kernel(estimator, options, table, ref_rewards, reward_range)`` -> its
    # :class:`~basis_bench.estimators.kernel.StepKernel`, what make_step_estimator and
    # trajectory replay run (a stateful estimator runs only so).
    kernel: KernelFactory = StatelessKernel
    # Whether it conditions on per-prompt features phi(x) (make_step_estimator's features):
    # training computes them (the policy's prompt hidden states) only for such an estimator.
    uses_features: bool = False
    # Rewards it can take, (low, high): a replay checks its data against them before it starts
    # (the SPO tracker's Beta posterior needs [0, 1]); None: any finite rewards.
    reward_bounds: RewardRange | None = None

    @property
    def stateful(self) -> bool:
        """Whether the estimator is its state across steps: registered with a step kernel
        alone, it has no one-step call and runs only as a stream of steps (trajectory
        replay, training). The one meaning of "stateful" in the package; whether a step
        stream carries anything is :attr:`StepEstimator.carries_state`."""
        return self.fn is None

    @property
    def defaults(self) -> dict[str, Any]:
        """This estimator's own option values that differ from its class's defaults."""
        base = as_dict(self.options_class())
        return {k: v for k, v in as_dict(self.default_options).items() if base[k] != v}

    def rollouts_per_prompt(self, group_size: int) -> int:
        """Rollouts each prompt needs per step: G for group estimators, else 1."""
        return group_size if self.group else 1

    def parse_options(self, values: Any = None) -> Any:
        """This estimator's options: its defaults updated by ``values`` (a mapping, or an
        instance of its options class, returned as is)."""
        if values is None:
            return self.default_options
        if isinstance(values, self.options_class):
            return values
        if not isinstance(values, Mapping):
            raise InputError(
                f"options of {self.name!r} must be a {self.options_class.__name__} or a mapping; "
                f"got {type(values).__name__}"
            )
        return options_from_mapping(
            self.options_class, values, f"estimator {self.name!r}", self.default_options
        )

    def check_input(self, batch: EstimatorInput) -> None:
        """The public-boundary checks: the data the estimator needs, finite rewards in range."""
        if self.uses_cache and batch.v_grid is None:
            raise InputError(
                f"estimator {self.name!r} needs the reference cache (v_grid) in its input"
            )
        if not self.group and batch.rewards.shape[-1] != 1:
            raise InputError(
                f"estimator {self.name!r} takes one rollout per prompt; got G={batch.rewards.shape[-1]}"
            )
        check_rewards(batch.rewards, batch.reward_range)

    def __call__(self, batch: EstimatorInput, options: Any = None, /, **overrides: Any) -> Array:
        """Baselines (..., B, G); ``options`` an options object or mapping, ``overrides``
        single keys on top (``est(batch, eps=1e-4)``)."""
        opts = self.parse_options(options)
        if overrides:
            opts = options_from_mapping(
                self.options_class, overrides, f"estimator {self.name!r}", opts
            )
        if self.fn is None:
            raise InputError(
                f"estimator {self.name!r} carries state across steps and has no one-step call; "
                "use make_step_estimator (a stream of steps) or trajectory replay"
            )
        if not isinstance(batch, EstimatorInput):
            raise InputError(
                f"estimator {self.name!r} takes an EstimatorInput; got {type(batch).__name__}"
            )
        batch = replace(batch, rewards=as_rewards(batch.rewards))
        self.check_input(batch)
        shape = tuple(batch.rewards.shape)
        if getattr(opts, "refine", False) and len(shape) >= 2 and shape[-2] < 2:
            raise InputError(
                f"estimator {self.name!r} refines leave-one-out over the batch and needs at "
                f"least 2 prompts; got B={shape[-2]}"
            )
        out = self.fn(batch, opts)
        got = getattr(out, "shape", None)
        if got is None or tuple(got) != shape:
            raise InputError(
                f"estimator {self.name!r} returned baselines of shape "
                f"{tuple(got) if got is not None else type(out).__name__}, not the rewards' "
                f"shape {shape} (one baseline per rollout)"
            )
        return out


ESTIMATORS: Registry[Estimator] = Registry("estimator", ENTRY_POINT_GROUP)


def register_estimator(
    name: str,
    *,
    group: bool = False,
    uses_cache: bool = False,
    description: str | None = None,
    options: type = NoOptions,
    defaults: Mapping[str, Any] | None = None,
    kernel: KernelFactory | None = None,
    uses_features: bool = False,
    reward_bounds: RewardRange | None = None,
    call_kernel: KernelFactory = StatelessKernel,
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register ``fn(batch, options) -> (..., B, G)`` under ``name``.

    ``options`` is the estimator's options dataclass (:class:`NoOptions` for none; such an
    estimator may also be written ``fn(batch)``);
    ``defaults`` are values of its fields that this name fixes, so one function can back
    several named variants (``basis_vop`` is BASIS with ``variant="vop"``). The
    description defaults to the first line of ``fn``'s docstring. ``kernel``: the factory
    of a stateful estimator's :class:`~basis_bench.estimators.kernel.StepKernel`; it has no
    one-step function, so the call registers it at once (description: the factory's
    docstring's first line) and takes no function after. ``uses_features``: it reads
    per-prompt features (``make_step_estimator(features=...)``). ``reward_bounds``: the
    rewards it can take, checked against a replay's data. ``call_kernel``: the kernel that
    runs ``fn`` on a stream of steps (BASIS's carries ``previous`` calibration's grid index).
    """
    default_options: Any = options_from_mapping(
        options, dict(defaults or {}), f"estimator {name!r}"
    )

    def entry(fn: EstimatorFn | None, doc: str | None) -> Estimator:
        lines = (doc or "").strip().splitlines()
        text = description if description is not None else (lines[0] if lines else "")
        return Estimator(
            name, fn, group, uses_cache, text, options, default_options,
            kernel or call_kernel, uses_features, reward_bounds,
        )  # fmt: skip

    if kernel is not None:
        ESTIMATORS.add(name, entry(None, kernel.__doc__))

    def wrap(fn: EstimatorFn) -> EstimatorFn:
        if kernel is not None:
            raise TypeError(
                f"estimator {name!r} is registered with its kernel alone and takes no "
                "function (give its text as description=)"
            )
        ESTIMATORS.add(name, entry(_batch_only(fn) if options is NoOptions else fn, fn.__doc__))
        return fn

    return wrap


def _batch_only(fn: Callable[..., Array]) -> EstimatorFn:
    """An estimator without options may be written ``fn(batch)``; it then gets no options."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature: call as registered
        return fn
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params):
        return fn
    return lambda batch, options: fn(batch)


def load_plugins(force: bool = False) -> list[str]:
    """Import the third-party estimator packages (entry point group ``basis_bench.estimators``).

    Each entry point names a module whose import registers its estimators with
    :func:`register_estimator` (``my_estimators = "my_pkg.estimators"``). A plug-in that
    fails to load is named in a :class:`~basis_bench.registry.PluginWarning` and skipped.
    Runs once per process unless ``force``; returns the names loaded now.
    """
    return ESTIMATORS.load_plugins(force)


def available() -> dict[str, Estimator]:
    """Every registered estimator, plug-ins included, in registration order."""
    return ESTIMATORS.available()


def get(name: str) -> Estimator:
    """The registered estimator called ``name``; a clear error lists the known ones."""
    return ESTIMATORS.get(name)


def parse_options(name: str, values: Any = None) -> Any:
    """The options object of estimator ``name`` from ``{key: value}`` (validated; an unknown
    key is an InputError naming the valid ones), over the estimator's own defaults."""
    return get(name).parse_options(values)
