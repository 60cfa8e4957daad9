"""A dataset's training record (``training.json`` beside ``rollouts/``): where each policy sat
in the training run that made it, so the trajectory replay can schedule as that run did.

    {"steps": {"early": 5, "middle": 15, "late": 40},
     "prompts_per_step": 16, "train_prompts": 128}

``steps``: the training step each checkpoint was saved at (the reference is step 0 and
needs no entry). ``prompts_per_step`` and ``train_prompts``: that run's batch and prompt set,
so a replay can visit each prompt as often per step as training did
(prompts_per_step / train_prompts visits a step). Written by ``oracle --step`` and
``import --step`` (one policy at a time, merged), and a plain JSON file to edit by hand for
data made before.

The same commands record the step with the rollouts too: each part they write carries
``"training_steps": {policy: step}`` in its ``basis_bench`` metadata, so a policy's step
travels with its files. :func:`training_record` reads both; a step given in both places
must agree (a mismatch is a one-line error), and data whose parts carry none (written
before, or edited by hand) is read from training.json alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import read_small
from basis_bench.guards.outputs import json_text, read_metadata, write_text_atomic
from basis_bench.rollouts.store import rollout_files

TRAINING_FILE = "training.json"
STEPS_KEY = "training_steps"  # in a part's basis_bench metadata: {policy: training step}
MAX_BYTES = 1 << 20  # a record of steps is small: anything larger is not one


@dataclass(frozen=True)
class TrainingRecord:
    """Each checkpoint's training step, and the run's prompts per step and prompt set."""

    steps: dict[str, int] = field(default_factory=dict)
    prompts_per_step: int | None = None
    train_prompts: int | None = None

    def visit_rate(self) -> float | None:
        """Visits a prompt got per training step: prompts_per_step / train_prompts."""
        if self.prompts_per_step is None or self.train_prompts is None:
            return None
        return self.prompts_per_step / self.train_prompts

    def to_json(self) -> str:
        data: dict[str, Any] = {"steps": dict(sorted(self.steps.items(), key=lambda kv: kv[1]))}
        for key in ("prompts_per_step", "train_prompts"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        return json_text(data, indent=2) + "\n"


def _count(value: Any, what: str, path: Path, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"{path}: {what} must be an integer >= {low}; got {value!r}")
    return value


def read_training_record(root: str | os.PathLike[str]) -> TrainingRecord | None:
    """The dataset's training record, None without one; a malformed file is a one-line error."""
    path = Path(root) / TRAINING_FILE
    raw = read_small(path, MAX_BYTES)  # a FIFO was read as absent: the epoch schedule
    if raw is None:
        return None
    try:
        data = bounded_json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not a readable training record ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("steps", {}), dict):
        raise InputError(f'{path}: must be a JSON object with "steps": {{policy: step}}')
    unknown = set(data) - {"steps", "prompts_per_step", "train_prompts"}
    if unknown:
        raise InputError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    steps = {str(k): _count(v, f"the step of {k!r}", path, 0) for k, v in data["steps"].items()}
    sizes = {
        k: _count(data[k], k, path, 1) if data.get(k) is not None else None
        for k in ("prompts_per_step", "train_prompts")
    }
    return TrainingRecord(steps, sizes["prompts_per_step"], sizes["train_prompts"])


def part_steps(root: str | os.PathLike[str]) -> dict[str, int]:
    """Each policy's training step as its rollout files' metadata records it (``STEPS_KEY``);
    two files that give one policy different steps are a one-line error."""
    steps: dict[str, tuple[int, Path]] = {}
    for path in rollout_files(root):
        given = read_metadata(path).get(STEPS_KEY)
        if given is None:
            continue
        if not isinstance(given, dict):
            raise InputError(f"{path}: its {STEPS_KEY} metadata must be {{policy: step}}")
        for policy, value in given.items():
            step = _count(value, f"{STEPS_KEY}[{policy!r}]", path, 0)
            seen = steps.setdefault(str(policy), (step, path))
            if seen[0] != step:
                raise InputError(
                    f"{path} records {policy!r} at training step {step}, {seen[1]} at step "
                    f"{seen[0]}: one policy, one step; re-sample or re-import one of them"
                )
    return {policy: step for policy, (step, _) in steps.items()}


def training_record(root: str | os.PathLike[str]) -> TrainingRecord | None:
    """The dataset's training record: training.json's, with the steps its parts' metadata
    records added; a policy whose step differs between the two is a one-line error. None
    when the dataset has neither."""
    record = read_training_record(root)
    recorded = part_steps(root)
    if record is None and not recorded:
        return None
    record = record or TrainingRecord()
    for policy, step in recorded.items():
        if record.steps.get(policy, step) != step:
            raise InputError(
                f"{Path(root) / TRAINING_FILE} puts {policy!r} at training step "
                f"{record.steps[policy]}, its rollouts' metadata at step {step}; correct "
                f"{TRAINING_FILE} (or record the step again with oracle/import --step)"
            )
    steps = {**recorded, **record.steps}
    return TrainingRecord(steps, record.prompts_per_step, record.train_prompts)


def record_step(root: str | os.PathLike[str], policy: str, step: int) -> TrainingRecord:
    """Set ``policy``'s training step in the dataset's record (made if absent), atomically."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise InputError(f"--step must be an integer >= 0; got {step!r}")
    old = read_training_record(root) or TrainingRecord()
    new = TrainingRecord({**old.steps, policy: step}, old.prompts_per_step, old.train_prompts)
    write_text_atomic(Path(root) / TRAINING_FILE, new.to_json())
    return new


def checkpoint_steps(record: TrainingRecord | None, checkpoints: list[str]) -> list[int] | None:
    """The steps of ``checkpoints`` in order; None when the record lacks any of them."""
    if record is None or any(c not in record.steps for c in checkpoints):
        return None
    return [record.steps[c] for c in checkpoints]
