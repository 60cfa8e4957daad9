"""The paper's training findings judged from arms (basis_bench/train/findings.py): the paired
intervals by hand and every branch of the rules (the three findings', not testable here,
confounded), on synthetic logs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from basis_bench.train import findings
from basis_bench.train.findings import MARGIN, judge, role, write_findings
from basis_bench.train.loop import append_jsonl
from basis_bench.train.summary import load_arm

T2 = 4.302653  # t_{0.975, 2}
ARMS = {
    "basis": {"estimator": "basis", "group_size": 8},
    "grpo": {"estimator": "grpo", "group_size": 8, "advantage_norm": "group_std"},
    "vanilla": {"estimator": "vanilla", "group_size": 8},
    "reinforce_pp": {"estimator": "reinforce_pp", "advantage_norm": "batch_whiten"},
}


def _arm(
    root: Path, name: str, evals: list[dict[int, float]], steps: int = 4, truncated=0.0, **config
):
    """An arm of one synthetic run per seed; ``evals[s]`` are seed s's held-out accuracies
    by step (the log reaches the last step given, so a run can be cut short); every step's
    truncated_share is ``truncated``."""
    settings = {"group_size": 1, "loss": "gpg", "lr": 1e-5, "advantage_norm": "none"}
    settings |= ARMS[name] | {"steps": steps} | config
    for seed, accuracy in enumerate(evals):
        run = root / name / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "config.json").write_text(json.dumps(settings | {"seed": seed}))
        for step in range(max(accuracy) + 1):
            record = {"step": step, "rollouts": 2, "seconds": {"sample": 1.0}}
            record["truncated_share"] = truncated
            if step in accuracy:
                record["eval_accuracy"] = accuracy[step]
            append_jsonl(run / "log.jsonl", record)
    return load_arm(root / name)


# Seven evaluations (steps 0-6) on 10 prompts: a run that learns and stays (decline 0), and
# one that falls from 0.6 to 0.1 for its last three (decline 0.5: collapsed, at a bar of 0.30)
STEADY = {0: 0.4, 1: 0.6, 2: 0.6, 3: 0.6, 4: 0.6, 5: 0.6, 6: 0.6}
FELL = {0: 0.4, 1: 0.6, 2: 0.6, 3: 0.6, 4: 0.1, 5: 0.1, 6: 0.1}


def _only(found, number):
    (one,) = [f for f in found if f.finding == number]
    return one


def test_roles_come_from_the_configuration():
    assert role({"estimator": "basis", "group_size": 8}) == "basis"
    assert role({"estimator": "grpo", "group_size": 8}) == "grpo"
    assert role({"estimator": "grpo", "group_size": 1}) is None  # G = 1 is not GRPO-type
    assert role({"estimator": "vanilla", "group_size": 8}) == "vanilla"
    assert role({"estimator": "basis_track", "group_size": 1}) is None
    assert role({"estimator": "no-such-estimator", "group_size": 1}) is None


def test_finding_1_pairs_basis_at_half_the_steps_with_grpo_final_by_seed(tmp_path):
    # BASIS's step-2 accuracy (half of GRPO's 4 steps; its step 4 must not be used) minus
    # GRPO's final, per seed: 0.50 - 0.45, 0.60 - 0.50, 0.40 - 0.40 = 0.05, 0.10, 0.00.
    basis = _arm(tmp_path, "basis", [{0: 0.1, 2: 0.5, 4: 0.0}, {2: 0.6, 4: 0.0}, {2: 0.4, 4: 0}])
    grpo = _arm(tmp_path, "grpo", [{4: 0.45}, {4: 0.5}, {4: 0.4}])
    one = _only(judge([basis, grpo], ["BASIS", "GRPO"]), 1)
    half = T2 * 0.05 / math.sqrt(3)  # the differences' sd is 0.05
    assert one.seeds == 3 and one.mean == pytest.approx(0.05)
    assert (one.low, one.high) == (pytest.approx(0.05 - half), pytest.approx(0.05 + half))
    assert one.comparison == "BASIS acc. at step 2 - GRPO final acc."
    # low = 0.05 - 0.124 < -M < high: three seeds this far apart cannot tell
    assert one.low < -MARGIN < one.high and one.verdict == "not resolvable"


@pytest.mark.parametrize(
    ("n", "low", "high", "non_inferior", "superior"),
    [
        (3, -0.04, 0.20, "reproduced", "not resolvable"),
        (3, 0.01, 0.04, "reproduced", "reproduced"),  # above 0, if by less than M
        (3, 0.01, 0.20, "reproduced", "reproduced"),
        (3, -0.30, -0.06, "not reproduced", "not reproduced"),
        (3, -0.30, 0.01, "not resolvable", "not reproduced"),
        (3, -0.30, 0.30, "not resolvable", "not resolvable"),
        (2, 0.10, 0.20, "not resolvable", "not resolvable"),  # too few seeds, whatever the numbers
    ],
)
def test_the_interval_rules(n, low, high, non_inferior, superior):
    assert findings.non_inferior(n, low, high) == non_inferior
    assert findings.superior(n, low, high) == superior


@pytest.mark.parametrize(
    ("vanilla", "basis", "verdict"),
    [
        ([True, True, False], [False, False, False], "reproduced"),
        ([True, True, True], [True, True, False], "not reproduced"),
        ([True, False, False], [False, False, False], "not resolvable"),
        ([True, True, True], [True, False, False], "not resolvable"),
        ([True, True], [False, False], "not resolvable"),
    ],
)
def test_the_collapse_rule(vanilla, basis, verdict):
    assert findings.collapse_verdict(vanilla, basis) == verdict


@pytest.mark.parametrize(
    ("first", "second", "finding", "why"),
    [
        ([True] * 3, [True] * 3, 1, "a and b collapsed in every seed (3/3): the rate fails both"),
        ([True] * 3, [True] * 3, 3, "a and b collapsed in every seed (3/3): the rate fails both"),
        ([False] * 3, [True, False, False], 3, "a collapsed in no seed (0/3; b 1/3): no collapse"),
        ([False] * 3, [True, False, False], 2, ""),  # vanilla steady: finding 2 is testable
        ([True, True, False], [True] * 3, 3, ""),
        ([True] * 2, [True] * 2, 1, ""),  # too few seeds: the interval rules say not resolvable
    ],
)
def test_not_testable_here(first, second, finding, why):
    found = findings.untestable(first, second, ("a", "b"), finding)
    assert found.startswith(why) and bool(found) == bool(why)


@pytest.mark.parametrize(
    ("basis", "rival", "role", "confounded"),
    [
        ([False, True, False], [True] * 3, "grpo", True),
        ([False] * 3, [True] * 3, "reinforce_pp", True),
        ([False] * 3, [True] * 3, "vanilla", False),  # the paper says vanilla collapses
        ([False] * 3, [True, True, False], "grpo", False),
        ([True] * 3, [True] * 3, "grpo", False),  # not testable here, before this rule
        ([False] * 2, [True] * 2, "grpo", False),
    ],
)
def test_confounded(basis, rival, role, confounded):
    why = findings.confounded(basis, rival, role, "G", [1.0, 0.98, 0.04][: len(rival)])
    assert bool(why) == confounded
    if confounded:
        assert why.startswith("G collapsed in 3/3 seeds (truncated share at collapse 1.00, 0.98")


def test_finding_3_counts_collapses_over_the_shared_finished_seeds(tmp_path):
    # vanilla: two of three seeds fall (collapsed), BASIS: none does, and a fourth BASIS seed
    # that is unfinished and has no vanilla partner.
    vanilla = _arm(tmp_path, "vanilla", [FELL, FELL, STEADY], steps=6)
    basis = _arm(tmp_path, "basis", [STEADY, STEADY, STEADY, {0: 0.9, 2: 0.0}], steps=6)
    three = _only(judge([vanilla, basis], ["vanilla", "BASIS"]), 3)
    assert three.collapsed == "vanilla 2/3, BASIS 0/3" and three.verdict == "reproduced"
    assert three.comparison == "vanilla decline - BASIS decline" and three.reason == ""
    assert three.seeds == 3 and three.mean == pytest.approx((0.5 + 0.5 + 0) / 3)
    two = _only(judge([vanilla, basis], ["vanilla", "BASIS"]), 2)
    # BASIS at step 3 against vanilla's final (BASIS seed 3 stops at step 2, unpaired):
    # 0.6 - 0.1, 0.6 - 0.1, 0.6 - 0.6
    assert two.seeds == 3 and two.mean == pytest.approx(1.0 / 3)
    assert two.collapsed == "BASIS 0/3, vanilla 2/3" and two.verdict == "not resolvable"


def test_grpo_collapsed_in_every_seed_confounds_finding_1(tmp_path):
    basis = _arm(tmp_path, "basis", [STEADY, STEADY, FELL], steps=6)
    grpo = _arm(tmp_path, "grpo", [FELL] * 3, steps=6, truncated=1.0)
    one = _only(judge([basis, grpo], ["BASIS", "GRPO"]), 1)
    assert one.verdict == "confounded" and one.collapsed == "BASIS 1/3, GRPO 3/3"
    assert one.reason.startswith("GRPO collapsed in 3/3 seeds (truncated share at collapse 1.00")
    both = _arm(tmp_path / "both", "basis", [FELL] * 3, steps=6)
    one = _only(judge([both, grpo], ["BASIS", "GRPO"]), 1)
    assert one.verdict == "not testable here" and "the rate fails both" in one.reason


def test_unfinished_runs_and_arms_at_other_settings_are_left_out(tmp_path):
    basis = _arm(tmp_path, "basis", [{2: 0.5}, {2: 0.5}, {2: 0.5}])
    cut = _arm(tmp_path, "grpo", [{0: 0.4, 3: 0.4}] * 3)  # 3 of 4 steps: no final yet
    one = _only(judge([basis, cut], ["B", "G"]), 1)
    assert one.seeds == 0 and math.isnan(one.mean) and one.verdict == "not resolvable"
    other_lr = _arm(tmp_path / "lr", "grpo", [{4: 0.4}] * 3, lr=2e-5)
    assert judge([basis, other_lr], ["B", "G"]) == []  # not one setting: nothing compared


def test_written_only_when_a_finding_has_its_arms(tmp_path):
    vanilla = _arm(tmp_path, "vanilla", [FELL] * 3, steps=6)
    assert write_findings([vanilla], ["vanilla"], tmp_path) == []
    basis = _arm(tmp_path, "basis", [STEADY] * 3, steps=6)
    csv, md = write_findings([vanilla, basis], ["vanilla", "BASIS"], tmp_path)
    text = md.read_text()
    assert "| 3 | vanilla G = 1 collapses, BASIS does not |" in text
    assert "vanilla 3/3, BASIS 0/3 | **reproduced** | – |" in text
    assert "| 2 |" in text and "+0.500 [+0.500, +0.500]" in text  # sd 0: a zero-width interval
    assert findings.WHEN_FIXED in text and "commit 2aaeaa0" in text
    assert csv.read_text().splitlines()[0].startswith("finding,claim,comparison,seeds,mean")


def test_any_number_of_seeds_is_judged(tmp_path):
    # 11 seeds (seed-10 sorts after seed-9): every shared finished seed counts, not 0-2
    vanilla = _arm(tmp_path, "vanilla", [STEADY] * 9 + [FELL] * 2, steps=6)
    basis = _arm(tmp_path, "basis", [STEADY] * 11, steps=6)
    found = judge([vanilla, basis], ["vanilla", "BASIS"])
    two, three = _only(found, 2), _only(found, 3)
    assert two.seeds == 11 and two.collapsed == "BASIS 0/11, vanilla 2/11"
    assert three.seeds == 11 and three.verdict == "not resolvable"  # 2 of 11: neither state
