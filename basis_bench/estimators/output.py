"""The one result type of every estimator step: baselines, BASIS's beta and its grid index."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from basis_bench.estimators._array import Array


@dataclass(frozen=True)
class StepOutput:
    """Baselines of one step ((..., B, G) from a step estimator, (B,) when it was given (B,));
    the calibrated beta and its grid index (scalars for one stream, arrays (...) over
    parallel streams; None where there is none); ``info``: an estimator's other per-step
    choices (``basis_memory``: gamma and m per prompt)."""

    baselines: Array
    beta: Any = None
    beta_index: Any = None
    info: Mapping[str, Any] | None = None
