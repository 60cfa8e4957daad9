"""The training study's committed record (issue 33): its tables are what the committed logs
give, and the README's training section quotes those tables, their verdicts' reasons and
when the rules were fixed, so no number there is typed by hand or left behind by a later
run; and the committed logs give issue 42's reading of findings 1 and 3."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from basis_bench.evaluation.figure_style import label
from basis_bench.train.figures import arm_names
from basis_bench.train.findings import WHEN_FIXED, judge, markdown
from basis_bench.train.summary import arms_table, load_arm, markdown_table, runs_table

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "experiments" / "study" / "logs"  # the main study, at lr 5e-5
RATES = sorted((ROOT / "experiments" / "study").glob("logs*"))  # and its other rates
_ORDER = re.search(
    r"ORDER=\$\{ORDER:-([^}]*)\}", (ROOT / "experiments/study/collect.sh").read_text()
)
ORDER = _ORDER.group(1).split() if _ORDER else []  # the arms in collect.sh's order


def _tables(logs: Path = LOGS) -> tuple[str, str]:
    # collect.sh's order: ORDER's arms, then any other arm folder (a sweep's), by name
    others = sorted(p.name for p in logs.iterdir() if p.is_dir() and p.name not in ORDER)
    folders = [n for n in ORDER if (logs / n).is_dir()] + [n for n in others if n != "figures"]
    arms = [load_arm(logs / name) for name in folders]
    names = arm_names(arms, label)
    return markdown_table(arms_table(runs_table(arms, names))), markdown(judge(arms, names))


def _rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip("|").split("|")]


@pytest.mark.parametrize("logs", RATES, ids=lambda p: p.name)
def test_the_committed_tables_are_what_the_committed_logs_give(logs):
    assert ORDER, "collect.sh's ORDER line is gone: this test reads the arms' order there"
    table, findings = _tables(logs)
    assert (logs / "figures" / "training_table.md").read_text() == table
    committed = logs / "figures" / "training_findings.md"
    expected = findings if len(_rows(findings)) > 1 else None  # a header alone: none written
    assert (committed.read_text() if committed.exists() else None) == expected


@pytest.mark.parametrize("which", [0, 1])
def test_the_readme_quotes_the_study_tables_row_for_row(which):
    readme = (ROOT / "README.md").read_text()
    rows = _rows(_tables()[which])
    if len(rows) == 1:
        pytest.skip("no finding has its arms among the committed logs yet")
    missing = [row for row in rows if row not in readme]
    assert not missing, f"README's training section lacks {missing[:2]}"


def _verdicts(findings: str) -> list[str]:
    """Each finding's "mean [CI] **verdict**", as the README's table by rate quotes it."""
    return [f"{cell[4]} {cell[6]}" for cell in map(_cells, _rows(findings)[1:])]


@pytest.mark.parametrize("logs", RATES, ids=lambda p: p.name)
def test_the_readme_quotes_every_rates_findings(logs):
    committed = logs / "figures" / "training_findings.md"
    if not committed.exists():
        pytest.skip(f"{logs.name} judges no finding")
    readme = (ROOT / "README.md").read_text()
    missing = [cell for cell in _verdicts(committed.read_text()) if cell not in readme]
    assert not missing, f"README's findings by rate lack {logs.name}'s {missing[:2]}"


def _reasons(findings: str) -> list[str]:
    """Each confounded or not-testable finding's why, as the README's list under the table
    by rate quotes it."""
    return [cell[7] for cell in map(_cells, _rows(findings)[1:]) if cell[7] != "–"]


@pytest.mark.parametrize("logs", RATES, ids=lambda p: p.name)
def test_the_readme_says_why_and_when_the_rules_were_fixed(logs):
    committed = logs / "figures" / "training_findings.md"
    if not committed.exists():
        pytest.skip(f"{logs.name} judges no finding")
    readme = (ROOT / "README.md").read_text()
    missing = [why for why in _reasons(committed.read_text()) if why not in readme]
    assert not missing, f"README lacks {logs.name}'s reasons {missing[:2]}"
    assert WHEN_FIXED in committed.read_text() and WHEN_FIXED in readme


def test_finding_1_at_5e_5_is_confounded_and_finding_3_not_testable_at_every_rate():
    """Issue 42's expected reading, from the committed logs by the written rules."""
    verdicts = {
        logs.name: {(c[0], c[2]): c[6] for c in map(_cells, _rows(_tables(logs)[1])[1:])}
        for logs in RATES
        if (logs / "figures" / "training_findings.md").exists()
    }
    assert verdicts["logs"][("1", "BASIS acc. at step 60 - GRPO (G=8) final acc.")] == (
        "**confounded**"
    )
    threes = [v for rate in verdicts.values() for (n, _), v in rate.items() if n == "3"]
    assert threes and set(threes) == {"**not testable here**"}
