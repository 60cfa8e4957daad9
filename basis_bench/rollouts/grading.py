"""How responses are graded: :class:`Grading`, one settings section that the oracle and
training both hold whole; it builds the :class:`~basis_bench.rollouts.rewards.RewardConfig`.
Kept free of math-verify: a command reads these options at startup without loading it.

Layer: a settings section above answers and rewards, which it builds from; neither needs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from basis_bench.rollouts.answers import ANSWER_FORMATS
from basis_bench.settings import setting

if TYPE_CHECKING:
    from basis_bench.rollouts.rewards import RewardConfig


@dataclass(frozen=True)
class Grading:
    """What is graded, how long grading may take, and where it runs. The config holding it
    checks these settings, naming each by its key."""

    answer_format: str = setting(
        "auto",
        choices=("auto", *ANSWER_FORMATS),
        help="What is graded. any: the last \\boxed{} if present, else the last expression "
        "(math-verify's default); boxed: only a \\boxed{} answer counts; number: the last "
        "number literal (in the last \\boxed{} if any); final_line: the last non-empty line "
        "must be the answer, alone or ending an arithmetic equation (8 + 6 = 14), and a "
        "response cut at max_new_tokens scores 0; auto: number for arithmetic prompts, any "
        "otherwise.",
    )
    verify_timeout: float = setting(
        5.0,
        min_val=0,
        include_boundaries="neither",
        help="Seconds allowed to parse and verify one response.",
    )
    reward_workers: int = setting(
        0,
        was=("score_workers",),
        min_val=0,
        help="Processes grading responses in parallel (0: in this process).",
    )

    reward_function: str = setting(
        "math-verify",
        flag="--reward",
        help="How a response is scored: math-verify against the gold answer (the settings "
        "above), or module:function, a reward function with TRL's signature "
        "f(prompts, completions, **columns) -> list[float] (module: importable from the "
        "current folder, or a .py file's path; docs/integrations.md).",
    )

    def reward(self, prompts: str) -> RewardConfig:
        """The grading of responses to the ``prompts`` source (``auto`` resolved by it)."""
        from basis_bench.rollouts.rewards import RewardConfig

        fmt = self.answer_format
        if fmt == "auto":
            fmt = "number" if prompts.partition(":")[0] == "arithmetic" else "any"
        return RewardConfig(fmt, self.verify_timeout, self.reward_function)  # type: ignore[arg-type]
