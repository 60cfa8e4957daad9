"""Checkpoints: a Hugging Face model directory plus ``trainer_state.pt`` beside it.

``RUN/checkpoints/step-T/`` holds ``save_pretrained`` model + tokenizer (``basis-bench
oracle --model DIR`` loads it) and the trainer state: step, optimizer, RNG states, the
estimator's state and the run's configuration, from which ``--resume`` continues. A
checkpoint is written as ``step-T.partial`` and renamed when complete; resume refuses a
``.partial`` folder. The trainer state is plain data (dicts, lists, numbers, strings,
tensors) and is read with ``torch.load(weights_only=True)``, so a checkpoint cannot run
code when it is loaded.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError, first_line
from basis_bench.estimators import StepEstimator
from basis_bench.guards.folders import inside_claim
from basis_bench.train.config import TrainConfig, config_dict, make_config, parse_override
from basis_bench.train.setup import CHECKPOINTS_DIR, Run

TRAINER_STATE = "trainer_state.pt"
PARTIAL = ".partial"

# Types beyond torch's weights-only defaults that a trainer state may hold. The state is
# written as plain data, so none are needed today; add a type here, not weights_only=False.
SAFE_GLOBALS: list[Any] = []


def estimator_state(step: StepEstimator) -> dict[str, Any]:
    """The step estimator's state as a trainer state carries it, in plain data: BASIS's
    ``previous`` grid index under ``basis_previous_index`` (None for other estimators), any
    other state (the SPO tracker's, ``basis_memory``'s) as lists under ``estimator_state``."""
    state: dict[str, Any] = {"basis_previous_index": step.previous_index}
    other = {k: v.tolist() for k, v in step.state_dict().items() if k != "previous_index"}
    if other:
        state["estimator_state"] = other
    return state


def load_estimator_state(step: StepEstimator, state: Mapping[str, Any]) -> None:
    """Restore :func:`estimator_state`'s keys of a trainer state into ``step``."""
    index = state.get("basis_previous_index")
    if index is not None:
        if step.previous_index is None or step.table is None or index >= len(step.table.betas):
            raise InputError(f"basis_previous_index {index} is not an index of its beta grid")
        step.previous_index = int(index)
    if state.get("estimator_state") is not None:
        step.load_state_dict({**step.state_dict(), **state["estimator_state"]})


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """``RUN/checkpoints/step-T`` (T zero-padded to six digits)."""
    return run_dir / CHECKPOINTS_DIR / f"step-{step:06d}"


def save_checkpoint(
    path: Path, policy: Any, tokenizer: Any, optimizer: Any, step: int, extra: dict[str, Any]
) -> Path:
    """``save_pretrained`` model + tokenizer and ``trainer_state.pt`` (optimizer, step, RNG
    states, estimator state, config), written beside and renamed into place when complete."""
    import torch

    tmp = inside_claim(path.with_name(path.name + PARTIAL))  # never through a link out
    shutil.rmtree(tmp, ignore_errors=True)
    rng: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    state = {"step": step, "optimizer": optimizer.state_dict(), "rng": rng, **extra}
    try:
        policy.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(state, tmp / TRAINER_STATE)
        _fsync_tree(tmp)
    except BaseException as err:
        full = _disk_full(tmp.parent, err)
        shutil.rmtree(tmp, ignore_errors=True)  # a disk full left a 650 MB .partial behind
        if full and not isinstance(err, OSError):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp)) from err
        raise
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def _disk_full(folder: Path, err: BaseException) -> bool:
    """Whether a failed write was a full disk: torch and safetensors raise their own error
    types for it (``RuntimeError: unexpected pos``, ``SafetensorError ... os error 28``)."""
    if f"os error {errno.ENOSPC}" in str(err):
        return True
    try:
        free = os.statvfs(folder)
    except OSError:
        return False
    return free.f_bavail * free.f_frsize < 2**20


def _fsync_tree(directory: Path) -> None:
    """Flush every file of a checkpoint to disk before it is renamed into place, so a crash
    after the rename cannot leave a complete-looking checkpoint with empty files."""
    for f in directory.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def save_run_checkpoint(run: Run, step: int) -> Path:
    """Step ``step``'s checkpoint of a run: policy, optimizer, RNG, estimator state, config."""
    extra = {
        "config": config_dict(run.config),
        "reference_weights": reference_weights(run.config.generation.model),
        **estimator_state(run.estimator),
    }
    models = run.models
    return save_checkpoint(
        checkpoint_dir(run.run_dir, step),
        models.policy,
        models.tokenizer,
        models.optimizer,
        step,
        extra,
    )


def reference_weights(model: str) -> str | None:
    """The reference model's fingerprint (:mod:`basis_bench.rollouts.fingerprint`), which a
    checkpoint records: resume refuses a reference whose weights changed since."""
    from basis_bench.rollouts.fingerprint import weights_sha256
    from basis_bench.rollouts.models import resolve_checkpoint

    return weights_sha256(resolve_checkpoint(model).path)


def load_trainer_state(checkpoint: str | os.PathLike[str]) -> dict[str, Any]:
    """The trainer state saved with a checkpoint (``--resume`` needs it)."""
    import pickle

    import torch

    if Path(checkpoint).name.endswith(PARTIAL):
        raise InputError(
            f"--resume {checkpoint}: an unfinished checkpoint (the run stopped while writing "
            f"it); resume from a complete RUN/{CHECKPOINTS_DIR}/step-T instead"
        )
    path = Path(checkpoint) / TRAINER_STATE
    if not path.is_file():
        here = [Path(checkpoint).parent, Path(checkpoint) / CHECKPOINTS_DIR]  # a sibling, a run
        found = sorted(
            str(c)
            for d in here
            if d.is_dir()
            for c in d.glob("step-*")
            if (c / TRAINER_STATE).is_file() and not c.name.endswith(PARTIAL)
        )
        raise InputError(
            f"--resume {checkpoint}: no {TRAINER_STATE} there; pass a checkpoint directory "
            f"written by basis-bench train (RUN/{CHECKPOINTS_DIR}/step-T)"
            + (f"; found: {', '.join(found)}" if found else "")
        )
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            state = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise InputError(
            f"--resume {checkpoint}: {TRAINER_STATE} is not a trainer state written by "
            "basis-bench (garbage, or more than plain data, which is not loaded: "
            f"{first_line(err)})"
        ) from err
    except (RuntimeError, EOFError, ValueError, OSError) as err:  # truncated or not a torch file
        if isinstance(err, OSError) and err.errno != errno.EINVAL:  # a real I/O error: say so
            raise
        raise InputError(
            f"--resume {checkpoint}: {TRAINER_STATE} is truncated or corrupt "
            f"({first_line(err)}); resume from another checkpoint"
        ) from err
    needed = ("step", "config")
    missing = [k for k in needed if not isinstance(state, dict) or k not in state]
    if missing:
        raise InputError(
            f"--resume {checkpoint}: {TRAINER_STATE} lacks {', '.join(missing)}; it was not "
            "written by basis-bench train"
        )
    bad = _malformed(state)
    if bad:
        raise InputError(
            f"--resume {checkpoint}: {TRAINER_STATE} holds {bad}; it was not written by "
            "basis-bench train, or was edited: resume from another checkpoint"
        )
    return dict(state)


def _malformed(state: Mapping[str, Any]) -> str | None:
    """What of a trainer state is not what :func:`save_checkpoint` writes (None: all is),
    checked before resume writes anything (a step of -3 emptied log.jsonl, then raised)."""
    import torch

    def count(value: Any, low: int) -> bool:
        return type(value) is int and low <= value < 2**63

    rng = state.get("rng")
    checks = {
        "step": count(state["step"], 1),
        "config": isinstance(state["config"], Mapping)
        and all(isinstance(k, str) for k in state["config"]),
        "optimizer": isinstance(state.get("optimizer", {}), Mapping),
        "rng": isinstance(rng, Mapping)
        and isinstance(rng.get("torch"), torch.Tensor)
        and rng["torch"].dtype == torch.uint8
        and isinstance(rng.get("cuda", []), list | tuple),
        "basis_previous_index": state.get("basis_previous_index") is None
        or count(state["basis_previous_index"], 0),
        "estimator_state": state.get("estimator_state") is None
        or isinstance(state["estimator_state"], Mapping),
        "reference_weights": state.get("reference_weights") is None
        or isinstance(state["reference_weights"], str),
    }
    wrong = [key for key, fine in checks.items() if not fine]
    if not wrong:
        return None
    return ", ".join(f"{key} = {state.get(key)!r:.60}" for key in wrong)


def resume_config(checkpoint: str | os.PathLike[str], overrides: Sequence[str] = ()) -> TrainConfig:
    """The run's own configuration from a checkpoint, ``run_dir`` set to the directory that
    holds it (so a moved run resumes in place), then ``overrides`` (e.g. ``steps=60``)."""
    run_dir = Path(checkpoint).resolve().parent.parent
    for text in overrides:
        if parse_override(text)[0] == "run_dir":
            # The run's log and checkpoints after T live in RUN and are cut back to T there.
            raise InputError(
                f"--resume continues the run in its own folder ({run_dir}); --set run_dir "
                "cannot move it: copy the run folder and resume from the copy's checkpoint"
            )
    state = load_trainer_state(checkpoint)
    values = dict(state["config"])
    values["run_dir"] = str(run_dir)
    config = make_config(values, overrides)
    recorded = state.get("reference_weights")  # None in checkpoints written before it
    if recorded and reference_weights(config.generation.model) not in (recorded, None):
        raise InputError(
            f"--resume {checkpoint}: the reference model {config.generation.model} holds other weights "
            "than when the run started (its reference cache and KL term would change mid-run); "
            "restore them, or start a new run"
        )
    return config


def restore(run: Run, checkpoint: str | os.PathLike[str]) -> int:
    """Load a checkpoint's optimizer, RNG and estimator state into ``run``; the next step."""
    import torch

    state = load_trainer_state(checkpoint)
    try:
        run.models.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise InputError(
            f"--resume {checkpoint}: {TRAINER_STATE} does not fit this run's model and "
            f"optimizer ({type(err).__name__}: {err}); resume from another checkpoint"
        ) from err
    try:
        load_estimator_state(run.estimator, state)
    except (TypeError, ValueError, IndexError) as err:
        raise InputError(
            f"--resume {checkpoint}: {TRAINER_STATE}'s estimator state does not fit this run's "
            f"estimator ({err}); resume from another checkpoint"
        ) from err
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return int(state["step"]) + 1
