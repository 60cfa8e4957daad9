"""``basis-bench figures`` over evaluate's results (issue 14): a table of another run, a
broken summary or record, a table that is a folder, each one line and nothing written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import EVAL, EVAL_GROUP, assert_one_line_error, evaluate_args, run_main, snapshot

from basis_bench.evaluation.figures import make_figures
from basis_bench.guards.outputs import claim_output_dir
from basis_bench.rollouts.simulate import SimulationConfig, simulate

# --------------------------------------------------------------------------- figures


def test_figures_refuse_a_table_of_another_run(monkeypatch, capsys, sim_dataset, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, old))[0] == 0
    args = evaluate_args(sim_dataset, new, "--estimators", "basis,reinforce_pp")
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    shutil.copy2(old / "g_sweep.csv", new / "g_sweep.csv")  # what a pre-fix rerun left
    before = snapshot(new)
    result = run_main(
        monkeypatch, capsys, "figures", "--results", str(new), "--out", str(tmp_path / "f")
    )
    assert_one_line_error(result, "g_sweep.csv", "not part of the run")
    assert snapshot(new) == before
    assert not (tmp_path / "f").exists()


def test_figures_refuse_a_record_whose_tables_are_no_map(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """A hand-edited "tables": 5 was a TypeError traceback."""
    res = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, res))[0] == 0
    record = json.loads((res / "run.json").read_text())
    (res / "run.json").write_text(json.dumps({**record, "tables": 5}))
    figures = ["figures", "--results", str(res), "--out", str(tmp_path / "f")]
    result = run_main(monkeypatch, capsys, *figures)
    assert_one_line_error(result, "run.json is not a readable run record", "'tables' is a int")


def test_evaluate_then_figures_with_their_defaults_run_in_a_clone(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """figures' default --out was 'figures', which in a clone holds the committed
    figures/default and figures/training: the default flow was refused."""
    monkeypatch.chdir(tmp_path)
    committed = tmp_path / "figures" / "default"
    claim_output_dir(committed, "figures")
    (committed / "fig3a_mse.png").write_bytes(b"committed")
    results = Path("results/value-estimation")
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results)).code == 0
    assert run_main(monkeypatch, capsys, "figures").code == 0
    assert (tmp_path / "figures" / "value-estimation" / "fig3a_mse.png").is_file()
    assert (committed / "fig3a_mse.png").read_bytes() == b"committed"


@pytest.fixture(scope="module")
def legacy_results(tmp_path_factory) -> Path:
    """A results folder whose run.json predates run ids (no table checksums)."""
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.run import evaluate

    data = simulate(
        SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6),
        tmp_path_factory.mktemp("d"),
    )
    out = tmp_path_factory.mktemp("r") / "res"
    cfg = EvaluateConfig(
        rollouts=str(data), repeats=3, oracle_n=2, ref_n=4, batch_size=4, group_size=2
    )
    evaluate(cfg, out)
    run = json.loads((out / "run.json").read_text())
    del run["tables"], run["run_id"]
    (out / "run.json").write_text(json.dumps(run))
    return out


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("truncated", "empty fields"),
        ("header-only", "no rows"),
        ("empty", "not a readable table"),
        ("renamed", "lacks the column(s) mse"),
        ("garbage", "not a readable table"),
    ],
)
def test_figures_refuse_a_broken_summary(
    monkeypatch, capsys, legacy_results, tmp_path, damage, needle
):
    results = tmp_path / "res"
    shutil.copytree(legacy_results, results)
    text = (legacy_results / "summary.csv").read_bytes()
    broken = {
        "truncated": text[: len(text) // 2],
        "header-only": text.splitlines(keepends=True)[0],
        "empty": b"",
        "renamed": text.replace(b",mse,", b",msx,", 1),
        "garbage": bytes(range(256)) * 8,
    }[damage]
    (results / "summary.csv").write_bytes(broken)
    before = snapshot(results)
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "figures", "--results", str(results), "--out", str(out))
    assert_one_line_error(result, "summary.csv", needle)
    assert snapshot(results) == before
    assert not out.exists()
    # with run ids, a table cut short is caught by its checksum too
    (results / "run.json").unlink()
    result = run_main(monkeypatch, capsys, "figures", "--results", str(results), "--out", str(out))
    assert_one_line_error(result, "no run.json")


def test_figures_out_a_file_or_a_results_folder(monkeypatch, capsys, legacy_results, tmp_path):
    (tmp_path / "file").write_text("keep")
    args = ["figures", "--results", str(legacy_results), "--out"]
    assert_one_line_error(run_main(monkeypatch, capsys, *args, str(tmp_path / "file")), "is a file")
    before = snapshot(legacy_results)
    result = run_main(monkeypatch, capsys, *args, str(legacy_results))
    assert_one_line_error(result, "already holds a results folder")
    assert snapshot(legacy_results) == before


def test_figures_know_one_dataset_by_any_spelling_of_its_path(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    """evaluate on --rollouts sim and sensitivity on its absolute path (or a link to it)
    recorded two strings, so figures skipped Fig. 5 as computed on another dataset."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to(sim_dataset)
    res = tmp_path / "res"
    evaluate = ["evaluate", "--rollouts", "sim", *EVAL_GROUP, "--no-trajectory"]
    assert run_main(monkeypatch, capsys, *evaluate, "--out", "res").code == 0
    for spelling in (f"{sim_dataset}/", "link"):
        sensitivity = ["sensitivity", "--rollouts", spelling, *EVAL, "--parameters", "eps"]
        assert run_main(monkeypatch, capsys, *sensitivity, "--out", str(res)).code == 0
        _, skipped = make_figures(res, tmp_path / "figs")
        assert "fig5_sensitivity" not in skipped, skipped
    run = json.loads((res / "run.json").read_text())
    assert run["rollouts"] == run["config"]["rollouts"] == str(sim_dataset.resolve())
    other = simulate(SimulationConfig(n_prompts=12, ref_n=4, checkpoint_n=6), tmp_path / "o")
    sensitivity = ["sensitivity", "--rollouts", str(other), *EVAL, "--parameters", "eps"]
    assert run_main(monkeypatch, capsys, *sensitivity, "--out", str(res)).code == 0
    _, skipped = make_figures(res, tmp_path / "figs")
    assert "sensitivity.csv was computed on" in skipped["fig5_sensitivity"]


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


def test_figures_refuse_a_table_that_is_a_folder(monkeypatch, capsys, sim_dataset, tmp_path):
    results = tmp_path / "res"
    assert run_main(monkeypatch, capsys, *evaluate_args(sim_dataset, results))[0] == 0
    (results / "g_sweep.csv").unlink()
    (results / "g_sweep.csv").mkdir()
    result = run_main(
        monkeypatch, capsys, "figures", "--results", str(results), "--out", str(tmp_path / "f")
    )
    assert_one_line_error(result, "g_sweep.csv is a folder, not a table")
    assert not (tmp_path / "f").exists()
