"""What a held-out evaluation says beyond accuracy: whether a falling policy broke its format
or collapsed as a policy (issue 42).

A format failure shows as responses that no longer end on an answer line (``format_share``
down) or run to ``max_new_tokens`` (``truncated_share`` up) while the answers given may stay
right; a policy collapse keeps the format and loses the answers: strict accuracy down with
the format intact, often with fewer distinct answers (one number for every prompt). Every
evaluation logs, of its greedy responses to the held-out prompts:

``eval_strict_accuracy``   accuracy under the ``final_line`` grader, whatever the run's grader
``eval_format_share``      share whose last line has final_line's form, not cut short
``eval_truncated_share``   share cut at ``max_new_tokens``
``eval_answer_diversity``  distinct last numbers / responses (a response without a number
                           adds none); the held-out gold answers' own value is its ceiling
                           for a policy that is always right
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from basis_bench.rollouts.answers import final_line, last_number
from basis_bench.rollouts.rewards import RewardConfig, score_many


def answer_diversity(responses: Sequence[str]) -> float:
    """Distinct last number literals over responses (0 for none)."""
    answers = {last_number(r) for r in responses} - {None}
    return len(answers) / len(responses) if responses else 0.0


def heldout_measures(
    responses: Sequence[str],
    finish_reasons: Sequence[str],
    answers: Sequence[str],
    reward: RewardConfig,
    statuses: Sequence[str],
    pool: ProcessPoolExecutor | None = None,
) -> dict[str, float]:
    """The measures above for one response per held-out prompt; ``statuses`` are the run's
    grader's, reused as the strict ones when that grader is ``final_line``."""
    if reward.answer_format != "final_line":
        strict = RewardConfig("final_line", reward.timeout_s)
        scored = score_many(
            [[r] for r in responses], answers, strict, pool, [[f] for f in finish_reasons]
        )
        statuses = [s for _, st in scored for s in st]
    cut = np.asarray(finish_reasons, dtype=object) == "length"
    formed = np.array([final_line(r) is not None for r in responses], dtype=bool) & ~cut
    return {
        "eval_strict_accuracy": float(np.mean(np.asarray(statuses, dtype=object) == "correct")),
        "eval_format_share": float(formed.mean()),
        "eval_truncated_share": float(cut.mean()),
        "eval_answer_diversity": answer_diversity(responses),
    }
