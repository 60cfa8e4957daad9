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


def is_hub_name(text: str) -> bool:
    """Whether ``text`` is spelled like a Hub repository name, ``org/name``."""
    return HUB_NAME.fullmatch(text) is not None and ".." not in text


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
