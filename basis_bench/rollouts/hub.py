"""Hugging Face Hub names (``org/name``), resolved as vLLM, TRL and lm-eval resolve them.

A name is looked up in the local Hugging Face cache (``$HF_HOME/hub``, or ``$HF_HUB_CACHE``)
and downloaded into it when missing, unless the Hub is off (``HF_HUB_OFFLINE=1``: the cache
only, ``local_files_only``). What comes back is the snapshot folder, a plain directory of
the repository's files, which the rest of the project reads like any local model directory
or data folder. A name that is neither cached nor reachable is one line naming the command
that downloads it.
"""

from __future__ import annotations

import re
from pathlib import Path

from basis_bench.errors import InputError, first_line

HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")
"""``org/name`` (one slash; Hub names use letters, digits, ``-``, ``_`` and ``.``)."""

MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
"""What a model download fetches: config, safetensors weights and tokenizer files (not the
other formats many repositories also hold: ONNX, GGUF, TensorFlow, original checkpoints)."""


MAX_HUB_PART = 96  # huggingface_hub's validate_repo_id: each part 1 to 96 characters
_HUB_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")


def hub_name_problem(text: str, *, org: bool = True) -> str | None:
    """Why ``text`` is not a Hub repository name, None when it is one: ``org/name`` (or
    ``name`` alone where ``org`` is False: a dataset such as gsm8k), each part 1 to 96
    letters, digits, ``-``, ``_``, ``.``, neither starting nor ending with ``-`` or ``.``,
    no ``--`` or ``..``, not ending in ``.git``: huggingface_hub's own rule
    (``validate_repo_id``), which is asked too. ``--model a/b--c`` passed the old rule and
    raised the library's HFValidationError, a traceback."""
    parts = text.split("/")
    if len(parts) > 2 or (org and len(parts) != 2):
        return "a Hub name is org/name" if org else "a Hub name is org/name or name"
    for part in parts:
        if not part:
            return "a part is empty"
        if len(part) > MAX_HUB_PART:
            return f"a part is longer than {MAX_HUB_PART} characters"
        if not _HUB_PART.fullmatch(part):
            return "letters, digits, -, _ and . only, not starting or ending with - or ."
    if "--" in text or ".." in text:
        return "-- and .. are not allowed"
    if text.endswith(".git"):
        return "it may not end in .git"
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id
    except ImportError:  # the library checks its own names; without it, ours stand
        return None
    try:
        validate_repo_id(text)
    except HFValidationError as err:
        return first_line(err)
    return None


def is_hub_name(text: str) -> bool:
    """Whether ``text`` is a Hub repository name ``org/name`` by our rule and the library's."""
    return hub_name_problem(text) is None


def hub_snapshot(name: str, repo_type: str, what: str) -> Path:
    """The local folder of Hub repository ``name`` (``repo_type`` "model" or "dataset"):
    from the cache, else downloaded into it (unless HF_HUB_OFFLINE). ``what`` is the
    setting as the user wrote it, for messages (``--model org/name``)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    problem = hub_name_problem(name, org=repo_type == "model")
    if problem is not None:  # the library's HFValidationError was a traceback
        raise InputError(f"{what}: not a Hugging Face Hub name ({problem})")
    offline = constants.is_offline_mode()
    download = f"hf download {name}" + ("" if repo_type == "model" else f" --repo-type {repo_type}")
    try:
        folder = snapshot_download(
            name,
            repo_type=repo_type,
            allow_patterns=MODEL_FILES if repo_type == "model" else None,
            local_files_only=offline,
        )
    except RepositoryNotFoundError as err:
        raise InputError(
            f"{what}: no such {repo_type} on the Hugging Face Hub (or it is private or "
            "gated: log in with `hf auth login`), and no local folder of that name"
        ) from err
    except LocalEntryNotFoundError as err:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise InputError(
            f"{what}: not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) "
            f"and {why}; download it where there is a network with `{download}` (the same "
            "HF_HOME), or pass a local path"
        ) from err
    except HfHubHTTPError as err:
        raise InputError(f"{what}: the Hugging Face Hub refused it ({first_line(err)})") from err
    return Path(str(folder))
