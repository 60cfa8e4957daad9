"""math-verify rewards: equivalent forms, missing or garbage answers, timeouts, statuses."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from basis_bench.rollouts.answers import last_boxed, last_number
from basis_bench.rollouts.rewards import (
    RewardConfig,
    parse_gold,
    score,
    score_many,
    scoring_pool,
)

# A tower of powers: sympy keeps evaluating it long past any sane time budget.
PATHOLOGICAL = "\\boxed{9^{9^{9^{9}}}}"


@pytest.mark.parametrize("gold", ["\\frac{1}{2}", "0.5", "1/2"])
def test_equivalent_forms_of_one_half_all_verify(gold):
    responses = [
        "The answer is \\boxed{\\frac{1}{2}}.",
        "so we get \\boxed{0.5}",
        "\\boxed{1/2}",
        "\\boxed{\\dfrac12}",
        "Thus $x = \\frac{1}{2}$",
        "the result is 0.5",
    ]
    rewards, statuses = score(responses, gold)
    assert rewards.dtype == np.float64
    assert rewards.tolist() == [1.0] * len(responses)
    assert statuses == ["correct"] * len(responses)


def test_wrong_answer_is_zero_with_status_wrong():
    rewards, statuses = score(["\\boxed{\\frac{1}{3}}", "\\boxed{0.25}"], "\\frac{1}{2}")
    assert rewards.tolist() == [0.0, 0.0]
    assert statuses == ["wrong", "wrong"]


def test_no_boxed_answer_depends_on_answer_format():
    response = "Adding them gives 14."
    assert score([response], "14", RewardConfig(answer_format="any"))[1] == ["correct"]
    assert score([response], "14", RewardConfig(answer_format="number"))[1] == ["correct"]
    rewards, statuses = score([response], "14", RewardConfig(answer_format="boxed"))
    assert rewards.tolist() == [0.0]
    assert statuses == ["no_answer"]


def test_boxed_format_grades_only_the_last_box():
    rewards, statuses = score(
        ["first \\boxed{3} then \\boxed{14}", "first \\boxed{14} then \\boxed{3}"],
        "14",
        RewardConfig(answer_format="boxed"),
    )
    assert rewards.tolist() == [1.0, 0.0]
    assert statuses == ["correct", "wrong"]


def test_number_format_does_not_credit_restating_the_question():
    # math-verify's default extraction evaluates "8 + 6" to 14; the number format must not.
    restated = "To solve 8 + 6, we need to think"
    assert score([restated], "14", RewardConfig(answer_format="any"))[1] == ["correct"]
    rewards, statuses = score([restated], "14", RewardConfig(answer_format="number"))
    assert rewards.tolist() == [0.0]
    assert statuses == ["wrong"]
    rewards, _ = score(
        ["8 - 22 = -14", "it is -14.", "\\boxed{-14}", "1,000"],
        "-14",
        RewardConfig(answer_format="number"),
    )
    assert rewards.tolist() == [1.0, 1.0, 1.0, 0.0]


FINAL_LINE = RewardConfig(answer_format="final_line")


def test_final_line_credits_only_a_last_line_that_is_the_answer():
    responses = [
        "14",  # the answer alone
        "Let me add.\n14",  # working, then the answer alone
        "8 + 6 = 14\n\n  \\boxed{14}  \n\n",  # boxed, blank lines after
        "8 + 6 = 14",  # an equation ending in the answer
        "(8 + 6) * 1 = 14.",  # with a full stop
        "14\nI hope this helps! 8 + 6 is a simple sum.",  # right answer, then rambling
        "8 + 6 = 14\nThe answer for the given math problem",  # the study's lock-in template
        "The answer is 14.",  # in a sentence
        "x = 14",  # not an arithmetic equation
        "14!",  # anything else on the line
        "Let me think.\n15",  # well formed and wrong
        "",  # nothing
    ]
    rewards, statuses = score(responses, "14", FINAL_LINE)
    assert rewards.tolist() == [1] * 5 + [0] * 7
    assert statuses == ["correct"] * 5 + ["no_answer"] * 5 + ["wrong", "no_answer"]
    # the lenient number grader credits every ill-formed one that holds 14 last
    lenient = score(responses, "14", RewardConfig(answer_format="number"))[0]
    assert lenient.tolist() == [1] * 5 + [0, 1, 1, 1, 1, 0, 0]


def test_final_line_lets_math_verify_decide_equality():
    rewards, statuses = score(["so\n-3", "\\boxed{-3}", "-3.0", "3", "1,000"], "-3", FINAL_LINE)
    assert rewards.tolist() == [1, 1, 1, 0, 0]
    assert statuses == ["correct", "correct", "correct", "wrong", "wrong"]
    assert score(["work\n1,000"], "1000", FINAL_LINE)[0].tolist() == [1.0]


def test_final_line_gives_zero_to_a_truncated_response_whatever_it_ends_on():
    # cut at max_new_tokens on a line that happens to hold the right number alone
    responses = ["14\n14\n14", "14\n14\n14", "14"]
    finish = ["length", "stop", "length"]
    rewards, statuses = score(responses, "14", FINAL_LINE, finish)
    assert rewards.tolist() == [0.0, 1.0, 0.0]
    assert statuses == ["truncated", "correct", "truncated"]
    # the other formats keep grading the text alone, as the committed runs were graded
    assert score(responses, "14", RewardConfig(answer_format="number"), finish)[0].tolist() == [
        1.0,
        1.0,
        1.0,
    ]
    pooled = score_many(
        [responses[:2], responses[2:]],
        ["14", "14"],
        FINAL_LINE,
        None,
        [
            finish[:2],
            finish[2:],
        ],
    )
    assert [s for _, st in pooled for s in st] == statuses
    with pytest.raises(ValueError, match="finish reasons"):
        score(responses, "14", FINAL_LINE, finish[:2])


@pytest.mark.parametrize("answer_format", ["any", "boxed", "number", "final_line"])
def test_garbage_never_raises_and_scores_zero(answer_format):
    garbage = [
        "",
        "   ",
        "asdf qwer",
        "\\boxed{}",
        "\\boxed{",
        "}{}{\\frac{",
        "\\boxed{\\frac{}{}}",
        "\x00\x01",
    ]
    rewards, statuses = score(garbage, "42", RewardConfig(answer_format=answer_format))
    assert rewards.tolist() == [0.0] * len(garbage)
    assert all(s in ("no_answer", "wrong") or s.startswith("error: ") for s in statuses), statuses


def test_pathological_expression_hits_the_timeout():
    config = RewardConfig(timeout_s=1.0)
    start = time.perf_counter()
    rewards, statuses = score([PATHOLOGICAL, "\\boxed{8}"], "8", config)
    elapsed = time.perf_counter() - start
    assert statuses == ["timeout", "correct"]
    assert rewards.tolist() == [0.0, 1.0]
    assert 1.0 <= elapsed < 4.0


def test_identical_responses_are_graded_once():
    # 20 copies of a response that times out cost one timeout, not twenty.
    config = RewardConfig(timeout_s=0.5)
    start = time.perf_counter()
    _, statuses = score([PATHOLOGICAL] * 20, "8", config)
    assert statuses == ["timeout"] * 20
    assert time.perf_counter() - start < 3.0


def test_timeout_restores_the_previous_alarm_handler():
    import signal

    before = signal.getsignal(signal.SIGALRM)
    score([PATHOLOGICAL], "8", RewardConfig(timeout_s=0.3))
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_unparsable_gold_gives_zero_to_every_response():
    assert parse_gold("") is None
    rewards, statuses = score(["\\boxed{1}", "2"], "")
    assert rewards.tolist() == [0.0, 0.0]
    assert statuses == ["gold_unparsed", "gold_unparsed"]


def test_empty_response_list():
    rewards, statuses = score([], "1")
    assert rewards.shape == (0,)
    assert statuses == []


def test_score_refuses_to_run_outside_the_main_thread():
    errors: list[BaseException] = []

    def run():
        try:
            score(["\\boxed{1}"], "1")
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert "main thread" in str(errors[0])


def test_score_many_in_worker_processes_matches_inline():
    groups = [["\\boxed{1}", "2", "\\boxed{1}"], ["\\boxed{0.5}", "nothing"], [PATHOLOGICAL]]
    answers = ["1", "\\frac{1}{2}", "8"]
    config = RewardConfig(
        timeout_s=3.0
    )  # generous: a loaded CI machine must not time out the easy ones
    inline = score_many(groups, answers, config)
    with scoring_pool(2) as pool:
        pooled = score_many(groups, answers, config, pool)
    assert [s for _, s in pooled] == [s for _, s in inline]
    assert [s for _, s in inline] == [
        ["correct", "wrong", "correct"],
        ["correct", "no_answer"],
        ["timeout"],
    ]
    for (a, _), (b, _) in zip(pooled, inline, strict=True):
        np.testing.assert_array_equal(a, b)


def test_score_many_checks_lengths():
    with pytest.raises(ValueError, match="answers"):
        score_many([["a"]], ["1", "2"])


def test_reward_config_validation():
    with pytest.raises(ValueError, match="answer_format"):
        RewardConfig(answer_format="latex")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout_s"):
        RewardConfig(timeout_s=0)


def test_last_boxed_matches_braces():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b \\boxed{x^{2}}") == "x^{2}"
    assert (
        last_boxed("\\boxed{\\left(3, \\frac{\\pi}{2}\\right)}")
        == "\\left(3, \\frac{\\pi}{2}\\right)"
    )
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("no box") is None


def test_last_number():
    assert last_number("8 + 6 = 14.") == "14"
    assert last_number("it is -3") == "-3"
    assert last_number("5-3") == "3"
    assert last_number("about 1,000 or 2.5") == "2.5"
    assert last_number("a total of 1,234") == "1234"
    assert last_number("none") is None
