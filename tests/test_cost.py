"""evaluate's memory model and the pre-flight check that names the option that fits."""

from __future__ import annotations

import pytest

from basis_bench.errors import InputError
from basis_bench.evaluation import cost, replay_plan
from basis_bench.evaluation.config import EvaluateConfig
from basis_bench.evaluation.cost import check_memory, evaluate_memory
from basis_bench.evaluation.run import evaluate

GIB = 2**30


def test_the_trajectory_term_is_bounded_and_the_rest_a_few_numbers_per_prompt():
    small, large = evaluate_memory(2500, 0, 200), evaluate_memory(17398, 0, 200)
    assert small < large < 2 * small
    assert large < GIB  # the paper's shape in under 1 GiB
    assert large - evaluate_memory(17398, 0, 0) <= replay_plan.STREAM_BYTES
    per_prompt = cost.TRANSIENT_BYTES
    assert evaluate_memory(17398, 0, 0) - evaluate_memory(2500, 0, 0) == per_prompt * (17398 - 2500)


def test_a_run_over_free_memory_is_refused_with_the_option_that_fits(monkeypatch):
    need, lighter = evaluate_memory(17398, 0, 200), evaluate_memory(17398, 0, 0)
    monkeypatch.setattr(cost, "available_memory", lambda: (need + lighter) // 2)
    with pytest.raises(InputError, match=r"17398 prompts.*pass --no-trajectory"):
        check_memory(17398, 0, 200)
    assert check_memory(17398, 0, 0) == lighter
    monkeypatch.setattr(cost, "available_memory", lambda: lighter // 2)
    with pytest.raises(InputError, match=r"fewer checkpoints at a time \(--checkpoint NAME\)"):
        check_memory(17398, 0, 200)
    monkeypatch.setattr(cost, "available_memory", lambda: None)  # the system does not say
    assert check_memory(17398, 0, 200) == need


def test_evaluate_checks_before_the_replay(monkeypatch, tmp_path):
    monkeypatch.setattr(cost, "available_memory", lambda: 1)
    with pytest.raises(InputError, match=r"pass --no-trajectory|--checkpoint"):
        evaluate(EvaluateConfig(repeats=2), tmp_path / "out")
    assert not (tmp_path / "out" / "summary.csv").exists()
