"""Prompt templates: how a problem becomes model input (:class:`PromptTemplate`, the default
instruction by prompt source); :func:`model_prompt` renders a problem or a trainer's own prompt.

Layer: bottom, free of polars and torch; sampling renders through it, the Generation section
builds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from basis_bench.errors import InputError

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

FAMILY_INSTRUCTIONS = {
    "arithmetic": "Work it out in one short line, e.g. 9 - 4 + 1 = 5 + 1 = 6.",
}
"""The oracle's default instruction by prompt source (``arithmetic:...``), where
:data:`DEFAULT_INSTRUCTION` does not serve. On ``arithmetic:n=4,digits=1-2,steps=1-2,seed=5``
SmolLM2-135M at T = 1 scored 0 of 64 asked to reason step by step (256 tokens), 0 of 128
asked for the number only, and 6 of 128 (4.7%) with this one line of working, whose
last number is the answer (docs/oracle.md)."""


def default_instruction(source: str) -> str:
    """The instruction a prompt source gets when none is given."""
    return FAMILY_INSTRUCTIONS.get(source.partition(":")[0], DEFAULT_INSTRUCTION)


@dataclass(frozen=True)
class PromptTemplate:
    """How a problem becomes model input.

    The user turn is the problem, a blank line and ``instruction`` (omitted when
    empty). ``system`` replaces the chat template's system message; None keeps the
    model's default.
    """

    instruction: str = DEFAULT_INSTRUCTION
    system: str | None = None

    def __post_init__(self) -> None:
        for name, text in (("instruction", self.instruction), ("system prompt", self.system)):
            try:
                (text or "").encode("utf-8")
            except UnicodeEncodeError as err:  # a non-UTF-8 byte of argv (surrogateescape)
                raise InputError(
                    f"the {name} holds a byte that is not UTF-8 text ({text!r:.60}); "
                    "write it in UTF-8"
                ) from err

    def user_message(self, problem: str) -> str:
        return f"{problem}\n\n{self.instruction}" if self.instruction else problem


DEFAULT_TEMPLATE = PromptTemplate()


def model_prompt(
    tokenizer: Any, prompt: Any, template: PromptTemplate = DEFAULT_TEMPLATE
) -> tuple[str, bool]:
    """(the text given to the model, whether the tokenizer adds its special tokens to it) for
    a problem (:func:`build_prompt`) or a trainer's own prompt (a
    :class:`~basis_bench.rollouts.trainer_prompts.TrainerPrompt`, rendered as the trainer does)."""
    if isinstance(prompt, str):
        return build_prompt(tokenizer, prompt, template), tokenizer_is_plain(tokenizer)
    text, special = prompt.render(tokenizer)
    return text, bool(special)


def tokenizer_is_plain(tokenizer: Any) -> bool:
    """A tokenizer without a chat template: its prompts get its own special tokens."""
    return getattr(tokenizer, "chat_template", None) is None


def build_prompt(tokenizer: Any, problem: str, template: PromptTemplate = DEFAULT_TEMPLATE) -> str:
    """The text given to the model: the tokenizer's chat template applied to the user
    turn, ending with the assistant header. A tokenizer without a chat template gets
    the plain user message followed by a blank line.
    """
    content = template.user_message(problem)
    if getattr(tokenizer, "chat_template", None) is None:
        return content + "\n\n"
    messages = [{"role": "user", "content": content}]
    if template.system is not None:
        messages.insert(0, {"role": "system", "content": template.system})
    return str(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
