"""Experiment trackers for `basis-bench train`: ``report_to`` (TRL's name for it).

Every record the loop writes to ``log.jsonl`` also goes, as scalars at the record's step,
to each tracker named in ``report_to``: the step's statistics under ``train/`` (rewards,
losses, baseline and advantage moments, beta, zero-advantage share, tokens, entropy), the
held-out evaluation's under ``eval/`` (``eval/accuracy``, ``eval/strict_accuracy``, ...),
the seconds of each phase under ``seconds/``. Values that are not finite numbers (beta of an
estimator without one, beta = inf: ``train/beta_infinite`` flags it) are left out. log.jsonl
stays the record of the run; the trackers are views of it, each an optional extra, none
needing a network:

- ``tensorboard``: event files in ``RUN/tensorboard`` (``tensorboard --logdir RUN``);
  a resumed run purges the events after its checkpoint's step, as log.jsonl does.
- ``wandb``: a Weights & Biases run in ``RUN/wandb``, project ``$WANDB_PROJECT`` (else
  ``basis-bench``), named after the run directory, the settings as its config;
  ``WANDB_MODE=offline`` keeps it on disk (``wandb sync`` uploads it later).
- ``trackio``: a trackio run, project ``$TRACKIO_PROJECT`` (else ``basis-bench``), stored
  locally unless trackio is told to use a Space (``trackio show`` opens the dashboard).
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from basis_bench.errors import InputError, first_line
from basis_bench.guards.outputs import finite

REPORTERS = ("tensorboard", "wandb", "trackio", "none")
PROJECT = "basis-bench"
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


class Tracker(Protocol):
    made: Path | None  # the folder of the run its start created (None: none, or elsewhere)

    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def close(self) -> None: ...


def _new(folder: Path) -> Path | None:
    """``folder`` where it does not exist yet (a tracker's start is about to make it)."""
    return None if os.path.lexists(folder) else folder


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A log record as tracker scalars: ``train/KEY``, ``eval/KEY`` for ``eval_KEY``
    (``eval/accuracy``, ...), ``seconds/PHASE``, every one finite (TensorBoard plots no
    infinity): a non-finite value is left out, and ``train/beta_infinite`` is 1.0 at a step
    whose beta was infinite (no tilt), else 0.0."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "seconds":
            out.update({f"seconds/{phase}": float(s) for phase, s in value.items()})
        elif key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
            out[f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"] = float(value)
    beta = record.get("beta")
    if isinstance(beta, int | float) and not isinstance(beta, bool):
        out["train/beta_infinite"] = float(math.isinf(beta))
    return {k: v for k, v in out.items() if math.isfinite(v)}


# What each tracker imports when it opens (tensorboard's writer is torch's).
_IMPORTS = {"tensorboard": "torch.utils.tensorboard", "wandb": "wandb", "trackio": "trackio"}


def check_reporters(report_to: Sequence[str]) -> None:
    """Each tracker's package imports, checked before any model loads: imported, not only
    found (a broken tensorboard passed ``find_spec`` and raised ImportError once the model
    had loaded)."""
    for name in report_to:
        module = _MODULES.get(name)
        if module is None:
            continue
        if importlib.util.find_spec(module) is None:
            raise InputError(
                f"report_to = {name} needs the {module!r} package: "
                f"pip install 'basis-bench[{name}]'"
            )
        try:
            importlib.import_module(_IMPORTS[name])
        except Exception as err:  # a broken install fails here, in one line
            raise InputError(
                f"report_to = {name}: the {module!r} package does not import "
                f"({type(err).__name__}: {first_line(err)}); reinstall it, or drop {name}"
            ) from err


class _TensorBoard:
    def __init__(self, run_dir: Path, start: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events at steps >= start, from the run before a resume, are hidden
        self.made = _new(run_dir / "tensorboard")
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # each record on disk as it is written, as log.jsonl is

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, settings: Mapping[str, Any]) -> None:
        import wandb

        # no tracker needs a network: offline unless the user chose a mode (wandb sync
        # uploads an offline run later); a login or network failure was a traceback
        os.environ.setdefault("WANDB_MODE", "offline")
        self.made = _new(run_dir / "wandb")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT),
            name=run_dir.name,
            dir=str(run_dir),
            config=finite(dict(settings)),  # fixed_beta = inf as "inf"
        )

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


class _Trackio:
    def __init__(self, run_dir: Path, settings: Mapping[str, Any]) -> None:
        import trackio

        self.trackio = trackio
        self.made: Path | None = None  # its runs are stored in trackio's own folder
        trackio.init(
            project=os.environ.get("TRACKIO_PROJECT", PROJECT),
            name=run_dir.name,
            config=finite(dict(settings)),  # fixed_beta = inf as "inf"
        )

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.trackio.log(dict(scalars), step=step)

    def close(self) -> None:
        self.trackio.finish()


class Trackers:
    """The trackers of ``report_to``, fed one log record at a time."""

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers = list(trackers)

    def __call__(self, record: Mapping[str, Any]) -> None:
        if self.trackers:
            values, step = scalars(record), int(record["step"])
            for tracker in self.trackers:
                tracker.log(values, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def discard(self) -> None:
        """Close them and remove the folders their start made: training stopped before it
        began (a model that does not load), so the run directory keeps nothing of them."""
        self.close()
        for tracker in self.trackers:
            if tracker.made is not None:
                shutil.rmtree(tracker.made, ignore_errors=True)


def open_trackers(
    report_to: Sequence[str], run_dir: Path, settings: Mapping[str, Any], start: int
) -> Trackers:
    """The trackers named in ``report_to`` ("none" and an empty list: none), for a run
    that writes its records from step ``start`` on (1: a new run, else a resumed one)."""
    opened: list[Tracker] = []
    makers: dict[str, Callable[[], Tracker]] = {
        "tensorboard": lambda: _TensorBoard(run_dir, start),
        "wandb": lambda: _WandB(run_dir, settings),
        "trackio": lambda: _Trackio(run_dir, settings),
    }
    try:
        for name in dict.fromkeys(report_to):
            if name not in makers:
                continue
            try:
                opened.append(makers[name]())
            except Exception as err:  # wandb.init without login or network: one line
                raise InputError(
                    f"report_to = {name} could not start ({type(err).__name__}: "
                    f"{first_line(err)}); fix it, or drop {name} from report_to"
                ) from err
    except BaseException:
        Trackers(opened).close()
        raise
    return Trackers(opened)
