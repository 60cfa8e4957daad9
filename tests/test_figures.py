"""Figures: every file is written, non-empty and a real PNG/PDF; sensitivity's sweep."""

from __future__ import annotations

import polars as pl
import pytest

from basis_bench.bench.config import EvaluateConfig
from basis_bench.bench.figures import FIGURES, make_figures
from basis_bench.bench.run import evaluate
from basis_bench.bench.sensitivity import SensitivityConfig, sensitivity
from basis_bench.errors import InputError
from basis_bench.rollouts.simulate import SimulationConfig, simulate


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    data = simulate(
        SimulationConfig(n_prompts=150, reference_n=32, checkpoint_n=48, seed=4),
        tmp_path_factory.mktemp("data"),
    )
    out = tmp_path_factory.mktemp("results")
    evaluate(
        EvaluateConfig(rollouts=str(data), repeats=40, oracle_n=32, ref_n=32, batch_size=32), out
    )
    sensitivity(
        SensitivityConfig(rollouts=str(data), repeats=10, oracle_n=32, ref_n=32, batch_size=32), out
    )
    return out


def test_every_figure_is_written_as_png_and_pdf(results, tmp_path):
    written, skipped = make_figures(results, tmp_path / "figs")
    assert skipped == {}
    expected = {f"{name}.{ext}" for name in FIGURES for ext in ("png", "pdf")}
    assert {p.name for p in written} == expected
    for path in written:
        data = path.read_bytes()
        assert len(data) > 5000, path.name
        assert data.startswith(b"\x89PNG" if path.suffix == ".png" else b"%PDF"), path.name
    assert not list((tmp_path / "figs").glob(".*tmp*"))


def test_figures_without_their_tables_are_skipped_and_no_results_is_an_error(results, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("summary.csv", "run.json"):  # a run of evaluate that wrote only summary.csv
        (partial / name).write_bytes((results / name).read_bytes())
    written, skipped = make_figures(partial, tmp_path / "figs")
    assert {p.stem for p in written} == {"fig3a_mse", "fig3d_extreme"}
    assert set(skipped) == set(FIGURES) - {"fig3a_mse", "fig3d_extreme"}
    assert "basis-bench sensitivity" in skipped["fig5_sensitivity"]
    with pytest.raises(InputError, match="run `basis-bench evaluate"):
        make_figures(tmp_path / "empty", tmp_path / "figs")


def test_sensitivity_sweeps_each_knob_and_skips_what_the_data_cannot_support(results):
    df = pl.read_csv(results / "sensitivity.csv")
    values = {
        p: sorted(g["value"].to_list())
        for (p,), g in df.filter(pl.col("checkpoint") == "late").group_by("parameter")
    }
    assert values["n"] == [8, 16, 32]  # 64 exceeds the 32 cached samples
    assert values["batch_size"] == [16, 32, 64, 128]  # 256 exceeds the 150 prompts
    assert values["grid_size"] == [8, 16, 32, 64]
    assert len(values["eps"]) == 7
    late_n = df.filter((pl.col("checkpoint") == "late") & (pl.col("parameter") == "n"))
    assert late_n["mse"].n_unique() == 3  # the cache really is cut to n
    assert set(df["checkpoint"]) == {"early", "middle", "late"}
    assert set(df["estimator"]) == {"basis"}
