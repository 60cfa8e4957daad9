"""The offline tilt table: every cached prompt's tilted value and variance at every beta.

Built once from the reference cache (``tilted_moments`` over the beta grid), it is what
BASIS, the value benchmark and the training loop index by batch: :class:`PromptIndex`
maps prompt ids to columns, :meth:`TiltTable.gather` returns a batch's (K, ..., B) grids
in the rewards' own namespace, dtype and device, ready for an
:class:`~basis_bench.estimators.registry.EstimatorInput`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from basis_bench.errors import InputError
from basis_bench.estimators._array import Array, asarray_like, to_numpy
from basis_bench.estimators.options import DEFAULT_PRIOR
from basis_bench.estimators.tilt import default_betas, tilted_moments


class PromptIndex:
    """Prompt id -> row of a per-prompt table (the reference cache), with clear errors."""

    def __init__(self, prompt_ids: Sequence[str]) -> None:
        self.rows = {pid: i for i, pid in enumerate(prompt_ids)}
        if len(self.rows) != len(prompt_ids):
            raise InputError("prompt_ids of the reference cache are not unique")

    def __call__(self, prompt_ids: Sequence[str]) -> np.ndarray:
        """Rows of a batch's prompts; prompts missing from the cache are an error."""
        missing = [p for p in prompt_ids if p not in self.rows]
        if missing:
            raise InputError(
                f"{len(missing)} prompt(s) of the batch are not in the reference cache, e.g. {missing[0]!r}"
            )
        return np.fromiter(
            (self.rows[p] for p in prompt_ids), dtype=np.int64, count=len(prompt_ids)
        )


@dataclass(frozen=True)
class TiltTable:
    """Tilted values and variances of P cached prompts at K betas (numpy, float64)."""

    betas: np.ndarray  # (K,)
    values: np.ndarray  # (K, P)
    variances: np.ndarray  # (K, P)
    index: PromptIndex | None = None  # prompt id -> column, when built with ids
    features: np.ndarray | None = None  # (P, d) per-prompt features (basis_context), or None

    @classmethod
    def from_cache(
        cls,
        ref_rewards: Array,
        betas: Sequence[float] | np.ndarray | None = None,
        prior: float = DEFAULT_PRIOR,
        prompt_ids: Sequence[str] | None = None,
        features: Array | None = None,
    ) -> TiltTable:
        """The table of a (P, n) reference cache (NaN = missing sample); default grid
        :func:`~basis_bench.estimators.tilt.default_betas`; ``features`` (P, d), one row per
        cached prompt, for the estimators that condition on the prompt."""
        ref = to_numpy(ref_rewards, dtype=np.float64)
        if prompt_ids is not None and (ref.ndim != 2 or ref.shape[0] != len(prompt_ids)):
            raise InputError(
                f"ref_rewards must be ({len(prompt_ids)}, n) to match prompt_ids; got {ref.shape}"
            )
        grid = np.asarray(default_betas() if betas is None else betas, dtype=np.float64)
        v, var = tilted_moments(ref, grid, prior=prior)
        index = PromptIndex(prompt_ids) if prompt_ids is not None else None
        feats = None if features is None else to_numpy(features, dtype=np.float64)
        if feats is not None and (feats.ndim != 2 or len(feats) != len(ref)):
            raise InputError(
                f"features must be (prompts, d) = ({len(ref)}, d), one row per cached prompt; "
                f"got {feats.shape}"
            )
        if feats is not None and not np.all(np.isfinite(feats)):
            raise InputError("prompt features must be finite")
        return cls(grid, np.asarray(v), np.asarray(var), index, feats)

    @property
    def inf_index(self) -> int | None:
        """Grid index of beta = inf (the reference mean), or None when the grid lacks it."""
        return inf_index(self.betas)

    def columns(self, prompt_ids: Sequence[str]) -> np.ndarray:
        """Columns of a batch's prompts (the table must have been built with prompt ids)."""
        if self.index is None:
            raise InputError("this tilt table was built without prompt ids")
        return self.index(prompt_ids)

    def gather(self, cols: np.ndarray, like: Array | None = None) -> tuple[Array, Array]:
        """(v_grid, var_grid), each (K, *cols.shape), as arrays like ``like`` (default numpy)."""
        # np.take, not values[:, cols]: the same elements, gathered about twice as fast
        v, var = np.take(self.values, cols, axis=1), np.take(self.variances, cols, axis=1)
        if like is None:
            return v, var
        return asarray_like(v, like), asarray_like(var, like)


def inf_index(betas: Array) -> int | None:
    """Index of the first beta = inf in a grid, or None."""
    inf = np.flatnonzero(np.isinf(to_numpy(betas)))
    return int(inf[0]) if inf.size else None


def grid_beta_index(betas: Array, beta: float, rtol: float = 1e-5) -> int:
    """Index of ``beta`` in the grid ``betas`` (equal within ``rtol``, so the grid's values as
    printed to 6 digits match; inf matches inf). A beta off the grid is an InputError: a
    fixed beta is used exactly or refused, never moved to a neighbour."""
    grid = to_numpy(betas, dtype=np.float64)
    for i, b in enumerate(grid):
        if b == beta or (math.isfinite(b) and abs(b - beta) <= rtol * abs(b)):
            return i
    shown = ", ".join(f"{b:.6g}" for b in grid)
    raise InputError(
        f"fixed_beta {beta:g} is not on the beta grid ({shown}); choose one of these values "
        "(the grid's size is --grid-size)"
    )
