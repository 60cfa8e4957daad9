"""Which optional extra installs a module, so a command that needs one it lacks ends in one
line naming the install (``pip install 'basis-bench[hf]'``), never a traceback that ends in
``No module named 'torch'``."""

from __future__ import annotations

EXTRA_OF = {
    "torch": "hf",
    "transformers": "hf",
    "accelerate": "hf",
    "gguf": "hf",
    "sentencepiece": "hf",
    "trl": "trl",
    "verl": "verl",
    "datasets": "datasets",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "trackio": "trackio",
}
"""Top-level module -> the extra of pyproject.toml that installs it (torch is in the trl and
verl extras too; ``hf`` is the one the sampler and training need)."""


def missing_extra(err: ModuleNotFoundError) -> str | None:
    """The one line for a module an extra installs, or None for any other missing module
    (a bug or a broken install, whose traceback is worth seeing)."""
    module = (err.name or "").split(".")[0]
    extra = EXTRA_OF.get(module)
    if extra is None:
        return None
    return (
        f"this command needs {module!r}, which the [{extra}] extra installs: "
        f"pip install 'basis-bench[{extra}]' (in a clone: pip install -e '.[{extra}]')"
    )
