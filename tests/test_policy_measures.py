"""The held-out evaluation's policy measures (issue 42): they tell a format failure from a
policy collapse on handwritten greedy responses, graded by the real math-verify."""

from __future__ import annotations

import pytest

from basis_bench.rollouts.rewards import RewardConfig, score
from basis_bench.train.policy_measures import answer_diversity, heldout_measures

ANSWERS = ["14", "3", "9", "-2"]  # What is 8 + 6, 5 - 2, 4 + 5, 3 - 5?
NUMBER = RewardConfig(answer_format="number")
STRICT = RewardConfig(answer_format="final_line")


def _measures(responses, finish, reward=NUMBER):
    statuses = [
        score([r], a, reward, [f])[1][0] for r, a, f in zip(responses, ANSWERS, finish, strict=True)
    ]
    return heldout_measures(responses, finish, ANSWERS, reward, statuses)


def test_a_healthy_policy():
    responses = ["8 + 6 = 14\n14", "3", "\\boxed{9}", "3 - 5 = -2\n-2"]
    assert _measures(responses, ["stop"] * 4) == {
        "eval_strict_accuracy": 1.0,
        "eval_format_share": 1.0,
        "eval_truncated_share": 0.0,
        "eval_answer_diversity": 1.0,
    }


def test_a_format_failure_keeps_the_answers_and_loses_the_format():
    # right numbers, then rambling to max_new_tokens or in a sentence: the lenient grader
    # still credits all four, the strict one none
    responses = ["14\nI hope this", "The answer is 3.", "9\n9\n9\n9", "So it is -2, I think."]
    finish = ["length", "stop", "length", "stop"]
    measures = _measures(responses, finish)
    lenient = [score([r], a, NUMBER)[0][0] for r, a in zip(responses, ANSWERS, strict=True)]
    assert lenient == [1.0] * 4
    assert measures == {
        "eval_strict_accuracy": 0.0,
        "eval_format_share": 0.0,
        "eval_truncated_share": 0.5,
        "eval_answer_diversity": 1.0,
    }


def test_a_policy_collapse_keeps_the_format_and_loses_the_answers():
    # one number for every prompt, well formed: right once, by chance
    responses = ["3", "3", "work\n3", "3"]
    assert _measures(responses, ["stop"] * 4) == {
        "eval_strict_accuracy": 0.25,
        "eval_format_share": 1.0,
        "eval_truncated_share": 0.0,
        "eval_answer_diversity": 0.25,
    }


@pytest.mark.parametrize(
    ("finish", "strict"), [(["stop"] * 4, 0.5), (["length", "stop", "stop", "length"], 0.25)]
)
def test_a_strict_run_reuses_its_own_grading(finish, strict):
    responses = ["14", "The answer is 3.", "9", "-3"]
    by_number = _measures(responses, finish, NUMBER)
    by_strict = _measures(responses, finish, STRICT)
    assert by_number == by_strict
    assert by_strict["eval_strict_accuracy"] == strict  # a cut "14" scores 0


def test_answer_diversity_counts_distinct_last_numbers():
    assert answer_diversity(["8 + 6 = 14", "14", "it is 14.", "1,000", "1000", "no"]) == 2 / 6
    assert answer_diversity([]) == 0.0
