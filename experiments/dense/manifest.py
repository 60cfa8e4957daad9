"""The dense trajectory's manifest (basis_bench/data/dense/manifest.json): the training
schedule a replay needs (prompts per step, rollouts per step, the prompt source) and, per
policy, the training step it was saved at, the samples per prompt it is sampled with and
the sha256 of the checkpoint's model.safetensors, so a later session can retrain and
check that it got the same weights before it samples more.

    python experiments/dense/manifest.py record runs/dense/train   # after training
    python experiments/dense/manifest.py verify runs/dense/train   # before sampling

Another set made the same way names its own (experiments/gradient/make.sh):

    python experiments/dense/manifest.py record runs/gradient/train \
        basis_bench/data/gradient 4,8,12 32 32
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

DATASET = Path("basis_bench/data/dense")
STEPS = range(3, 31, 3)
SAMPLES = 128  # per prompt at every checkpoint
REFERENCE_SAMPLES = 64


def policy_name(step: int) -> str:
    return f"step-{step:03d}"


def weights_sha256(checkpoint: Path) -> str:
    digest = hashlib.sha256()
    with open(checkpoint / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record(run: Path, dataset: Path = DATASET, steps: Sequence[int] = STEPS,
           samples: int = SAMPLES, reference_samples: int = REFERENCE_SAMPLES) -> None:  # fmt: skip
    """Write the manifest (and the dataset's training.json, the schedule a replay reads)
    from a finished training run."""
    config = json.loads((run / "config.json").read_text())
    config = config.get("config", config)
    group = 1  # BASIS takes one rollout per prompt visit
    policies = [{"policy": "reference", "step": 0, "samples": reference_samples, "sha256": None}]
    for step in steps:
        ckpt = run / "checkpoints" / f"step-{step:06d}"
        policies.append(
            {
                "policy": policy_name(step),
                "step": step,
                "samples": samples,
                "sha256": weights_sha256(ckpt),
            }
        )
    manifest = {
        "description": f"SmolLM2-135M-Instruct trained by experiments/{dataset.name}/train.toml; "
        "policy = checkpoint, step = the training step it was saved at (0: the base model)",
        "prompts": config["train_prompts"],
        "train_prompts_are_the_dataset_prompts": True,
        "rollouts_per_step": config["rollouts_per_step"],
        "prompts_per_step": config["rollouts_per_step"] // group,
        "estimator": config["estimator"],
        "seed": config["seed"],
        "policies": policies,
    }
    dataset.mkdir(parents=True, exist_ok=True)
    (dataset / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    training = {
        "steps": {p["policy"]: p["step"] for p in policies if p["step"]},
        "prompts_per_step": manifest["prompts_per_step"],
        "train_prompts": int(config["train_prompts"].split("n=")[1].split(",")[0]),
    }
    (dataset / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    print(json.dumps(manifest, indent=1))


def verify(run: Path, dataset: Path = DATASET) -> None:
    """Stop (exit 1) unless every checkpoint present has the manifest's weights."""
    manifest = json.loads((dataset / "manifest.json").read_text())
    bad = []
    for p in manifest["policies"][1:]:
        ckpt = run / "checkpoints" / f"step-{p['step']:06d}"
        got = weights_sha256(ckpt) if ckpt.exists() else "missing"
        print(f"{p['policy']}: {'ok' if got == p['sha256'] else got}")
        if got != p["sha256"]:
            bad.append(p["policy"])
    if bad:
        sys.exit(
            f"checkpoints differ from the manifest (or are missing): {bad}; do not sample them"
        )


if __name__ == "__main__":
    command, run, *rest = sys.argv[1:]
    if command == "verify":
        verify(Path(run), *(Path(r) for r in rest[:1]))
    elif rest:  # record RUN DATASET STEPS SAMPLES REFERENCE_SAMPLES
        steps = [int(s) for s in rest[1].split(",")]
        record(Path(run), Path(rest[0]), steps, int(rest[2]), int(rest[3]))
    else:
        record(Path(run))
