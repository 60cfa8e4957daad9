"""Figures: every file is written as a real PNG/PDF; what each figure draws (bars, lines,
legend labels from the registry); sensitivity's sweep."""

from __future__ import annotations

import json
import re
import shutil

import polars as pl
import pytest

from basis_bench.errors import InputError
from basis_bench.evaluation.bar_figures import LOG_SPAN
from basis_bench.evaluation.bin_figures import THIN_BIN
from basis_bench.evaluation.config import EvaluateConfig
from basis_bench.evaluation.figure_style import CORRECTED_MSE, RAW_MSE, SAME_RTOL, paper_style
from basis_bench.evaluation.figures import FIGURES, make_figures
from basis_bench.evaluation.run import evaluate
from basis_bench.evaluation.sensitivity import SensitivityConfig, sensitivity
from basis_bench.rollouts.simulate import SimulationConfig, simulate


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    data = simulate(
        SimulationConfig(n_prompts=150, ref_n=32, checkpoint_n=48, seed=4),
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
    # the gradient figure needs score sketches, which simulated data has not: its own test
    assert skipped.keys() == {"fig_gradient"} and "gradient.csv not in" in skipped["fig_gradient"]
    expected = {
        f"{name}.{ext}" for name in FIGURES if name != "fig_gradient" for ext in ("png", "pdf")
    }
    assert {p.name for p in written} == expected
    for path in written:
        data = path.read_bytes()
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


def test_a_skipped_figure_of_an_earlier_call_is_removed(results, tmp_path):
    """Figures of a fuller run stayed beside a later run's, as if drawn from it."""
    figs = tmp_path / "figs"
    make_figures(results, figs)
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("summary.csv", "run.json"):
        (partial / name).write_bytes((results / name).read_bytes())
    written, skipped = make_figures(partial, figs)
    assert {p.name for p in figs.iterdir() if not p.name.startswith(".")} == {
        p.name for p in written
    }
    assert skipped["fig2_fixed_beta"].endswith(
        f"; removed the earlier fig2_fixed_beta.png and fig2_fixed_beta.pdf from {figs}"
    )
    _, skipped = make_figures(partial, figs)
    assert "removed" not in skipped["fig2_fixed_beta"]


def test_sensitivity_sweeps_each_knob_and_skips_what_the_data_cannot_support(results):
    df = pl.read_csv(results / "sensitivity.csv")
    values = {
        p: sorted(g["value"].to_list())
        for (p,), g in df.filter(pl.col("checkpoint") == "late").group_by("parameter")
    }
    assert values["ref_n"] == [8, 16, 32]  # 64 exceeds the 32 cached samples
    assert values["batch_size"] == [16, 32, 64, 128]  # 256 exceeds the 150 prompts
    assert values["grid_size"] == [8, 16, 32, 64]
    assert len(values["eps"]) == 7
    late_n = df.filter((pl.col("checkpoint") == "late") & (pl.col("parameter") == "ref_n"))
    assert late_n["mse"].n_unique() == 3  # the cache really is cut to n
    assert set(df["checkpoint"]) == {"early", "middle", "late"}
    assert set(df["estimator"]) == {"basis"}


# ------------------------------------------------------------------ what each figure draws

# The display names the estimators declare at registration, in registration order.
ONE_STEP_LABELS = [
    "REINFORCE++", "GRPO (G=8)", "RLOO (G=8)", "Reference mean", "Offline $\\hat V$", "BASIS",
    "BASIS (paper)", "BASIS-VOP", "BASIS-RVG", "James-Stein (G=8)", "A*-PO",
]  # fmt: skip
SAME_AS_BASIS = "Offline $\\hat V$ (≈ BASIS)"  # on this data too: drawn over BASIS, hollow
LINE_PLOT_LABELS = [
    "REINFORCE++", "GRPO (G=8)", "RLOO (G=8)", "Reference mean", SAME_AS_BASIS, "BASIS",
    "James-Stein (G=8)", "A*-PO",
]  # fmt: skip


@pytest.fixture(scope="module")
def drawn(results):
    """Every figure of the results, drawn (not saved), by name."""
    import matplotlib.pyplot as plt

    paper_style()
    figures = {name: draw(results) for name, (_, draw) in FIGURES.items() if name != "fig_gradient"}
    yield figures
    for fig in figures.values():
        plt.close(fig)


def _texts(legend) -> list[str]:
    return [t.get_text() for t in legend.get_texts()]


def _bars(ax) -> list[int]:
    """Bars per ``ax.bar`` call (one call per checkpoint)."""
    from matplotlib.container import BarContainer

    return [len(c) for c in ax.containers if isinstance(c, BarContainer)]


def _ticks(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels()]


def _checkpoints(results, table: str) -> list[str]:
    return pl.read_csv(results / table)["checkpoint"].unique(maintain_order=True).to_list()


def test_bar_charts_draw_one_bar_per_estimator_and_checkpoint(results, drawn):
    checkpoints = _checkpoints(results, "summary.csv")
    (mse,) = drawn["fig3a_mse"].axes
    assert _ticks(mse) == ONE_STEP_LABELS  # the zero baseline left out, and said so
    assert _bars(mse) == [len(ONE_STEP_LABELS)] * len(checkpoints)
    assert _texts(mse.get_legend()) == checkpoints
    assert "zero baseline omitted" in mse.get_title()
    (extreme,) = drawn["fig3d_extreme"].axes
    assert _ticks(extreme) == ["REINFORCE (b=0)", *ONE_STEP_LABELS]
    assert _bars(extreme) == [len(ONE_STEP_LABELS) + 1] * len(checkpoints)
    (choice,) = drawn["fig_beta_choice"].axes
    betas = pl.read_csv(results / "beta_choice.csv").filter(pl.col("checkpoint") == "early")
    assert _bars(choice) == [betas.height] * len(checkpoints)
    assert _texts(choice.get_legend()) == checkpoints


def test_line_plots_draw_one_line_per_estimator_in_each_checkpoint_panel(results, drawn):
    for name, table in (
        ("fig3b_heterogeneity", "by_heterogeneity.csv"),
        ("fig3c_difficulty", "by_difficulty.csv"),
    ):
        fig = drawn[name]
        assert [ax.get_title() for ax in fig.axes] == [
            f"checkpoint: {c}" for c in _checkpoints(results, table)
        ]
        for ax in fig.axes:  # the zero baseline and the BASIS variants are left out
            assert [line.get_label() for line in ax.get_lines()] == LINE_PLOT_LABELS
        assert _texts(fig.legends[0]) == LINE_PLOT_LABELS


def test_fixed_beta_and_group_sweep_draw_their_curves_and_levels(results, drawn):
    fixed = drawn["fig2_fixed_beta"]
    assert len(fixed.axes) == len(_checkpoints(results, "fixed_beta.csv"))
    levels = ["initial $\\hat V_\\beta$", "initial at $\\beta=\\infty$"]
    levels += ["refined $\\tilde V_\\beta$", "refined at $\\beta=\\infty$"]
    for ax in fixed.axes:
        assert [line.get_label() for line in ax.get_lines()] == levels
    sweep = drawn["fig3_group_sweep"]
    assert len(sweep.axes) == len(_checkpoints(results, "g_sweep.csv"))
    single = ["REINFORCE++ (1 rollout)", "Reference mean (cache only)", "BASIS (1 rollout)"]
    assert _texts(sweep.legends[0]) == [*single, "GRPO", "RLOO", "James-Stein"]
    for ax in sweep.axes:
        assert [line.get_label() for line in ax.get_lines()][-3:] == single


def test_fig5_title_gives_the_values_the_run_held(drawn):
    """The title said the defaults (n=64, B=64) whatever the run used (here 32 and 32)."""
    title = drawn["fig5_sensitivity"].get_suptitle()
    assert "$n=32$, $B=32$, $K=32$" in title and "10^{-6}" in title, title


def test_fig5_title_names_the_estimators_swept(results, tmp_path):
    """A sweep of basis_vop alone was titled "BASIS sensitivity", its lines named by
    checkpoint only."""
    import matplotlib.pyplot as plt

    folder = tmp_path / "res"
    shutil.copytree(results, folder)
    table = pl.read_csv(folder / "sensitivity.csv")
    table.with_columns(pl.lit("basis_vop").alias("estimator")).write_csv(folder / "sensitivity.csv")
    fig = FIGURES["fig5_sensitivity"][1](folder)
    assert fig.get_suptitle().startswith("BASIS-VOP sensitivity (others at")
    plt.close(fig)


@pytest.mark.parametrize("config", [[], {"eps": "x", "ref_n": None}, {"eps": float("inf")}])
def test_fig5_title_survives_a_hand_edited_record(results, tmp_path, config):
    import matplotlib.pyplot as plt

    folder = tmp_path / "res"
    shutil.copytree(results, folder)
    record = json.loads((folder / "sensitivity.json").read_text())
    (folder / "sensitivity.json").write_text(json.dumps({**record, "config": config}))
    fig = FIGURES["fig5_sensitivity"][1](folder)
    assert "$n=?$" in fig.get_suptitle()
    plt.close(fig)


def test_sensitivity_and_trajectory_draw_one_line_per_series(results, drawn):
    sens = pl.read_csv(results / "sensitivity.csv")
    fig = drawn["fig5_sensitivity"]
    assert len(fig.axes) == sens["parameter"].n_unique()
    checkpoints = _checkpoints(results, "sensitivity.csv")
    for ax in fig.axes:  # one line with its error bars per checkpoint
        assert [bars.get_label() for bars in ax.containers] == checkpoints
    assert _texts(fig.legends[0]) == checkpoints
    (ax,) = drawn["fig_trajectory"].axes
    epochs = pl.read_csv(results / "trajectory.csv").filter(pl.col("scope") == "epoch")
    labels = [
        *ONE_STEP_LABELS[:9],
        "BASIS memory",
        "BASIS context",
        *ONE_STEP_LABELS[9:],
        "SPO tracker",
        "BASIS track",
    ]
    named = [re.sub(r" \(≈ .*\)$", "", t) for t in _texts(ax.get_legend())]  # coinciding
    assert named == ["REINFORCE (b=0)", *labels]
    assert len(ax.collections) == epochs["estimator"].n_unique()  # one CI band per line


def test_checkpoint_names_sit_above_the_lines_and_below_the_title(results, drawn):
    """fig_trajectory's checkpoint names were drawn inside the axes, on the lines ("middle"
    unreadable): each is above the plotting area and under the title."""
    fig = drawn["fig_trajectory"]
    (ax,) = fig.axes
    fig.canvas.draw()
    area, title = ax.get_window_extent(), ax.title.get_window_extent()
    names = [t for t in ax.texts if t.get_text() in _checkpoints(results, "trajectory.csv")]
    assert len(names) == len(_checkpoints(results, "trajectory.csv"))
    for text in names:
        box = text.get_window_extent()
        assert area.y1 <= box.y0 and box.y1 <= title.y0, text.get_text()


def _line(ax, text: str):
    return next(line for line in ax.get_lines() if line.get_label() == text)


def _offline_scaled(results, tmp_path, factor: float):
    """fig3b with Offline V^'s MSE set to ``factor`` times BASIS's in every bin."""
    folder = tmp_path / "res"
    shutil.copytree(results, folder)
    table = pl.read_csv(folder / "by_heterogeneity.csv")
    basis = table.filter(pl.col("estimator") == "basis").select("checkpoint", "bin", "mse")
    table = table.join(basis, on=["checkpoint", "bin"], suffix="_basis").with_columns(
        pl.when(pl.col("estimator") == "offline")
        .then(pl.col("mse_basis") * factor)
        .otherwise(pl.col("mse"))
        .alias("mse")
    )
    table.drop("mse_basis").write_csv(folder / "by_heterogeneity.csv")
    return FIGURES["fig3b_heterogeneity"][1](folder)


@pytest.mark.parametrize("factor", [1.0, 1.01])
def test_a_line_under_another_is_drawn_apart_and_named(results, tmp_path, factor):
    """Offline V^ equal to BASIS (as in the default data's fig3b) was drawn under it, unseen:
    it is drawn hollow and dashed over it, its legend saying which line it coincides with,
    "≈" whether equal or within 2% (one line at printed size; "=" in one figure beside "≈"
    in another read as a difference between them)."""
    import matplotlib.pyplot as plt

    fig = _offline_scaled(results, tmp_path, factor)
    assert SAME_AS_BASIS in _texts(fig.legends[0]) and "BASIS" in _texts(fig.legends[0])
    for ax in fig.axes:
        over, under = _line(ax, SAME_AS_BASIS), _line(ax, "BASIS")
        assert over.get_markerfacecolor() == "none" and under.get_markerfacecolor() != "none"
        assert over.get_zorder() > under.get_zorder()
        assert over.get_linestyle() != under.get_linestyle()
    plt.close(fig)


def test_a_line_further_than_two_percent_is_its_own(results, tmp_path):
    """3% above BASIS everywhere is told apart at printed size: no "≈", drawn plain."""
    import matplotlib.pyplot as plt

    assert 1.03 > 1 + SAME_RTOL
    fig = _offline_scaled(results, tmp_path, 1.03)
    assert "Offline $\\hat V$" in _texts(fig.legends[0]) and SAME_AS_BASIS not in _texts(
        fig.legends[0]
    )
    assert _line(fig.axes[0], "Offline $\\hat V$").get_markerfacecolor() != "none"
    plt.close(fig)


def test_families_differ_by_line_style_and_members_by_marker(drawn):
    """Fifteen lines in near-identical colours and one style could not be told apart: each
    family (reference cache, group, batch) has its own line style, each member a marker."""
    ax = drawn["fig3c_difficulty"].axes[0]
    style = {line.get_label(): (line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
    cache = ["Reference mean", "BASIS", "A*-PO"]
    group = ["GRPO (G=8)", "RLOO (G=8)", "James-Stein (G=8)"]
    assert len({style[n][0] for n in ("REINFORCE++", cache[0], group[0])}) == 3
    for family in (cache, group):
        assert len({style[n][0] for n in family}) == 1
        assert len({style[n][1] for n in family}) == len(family)


def test_bin_labels_are_distinct_and_upright(drawn):
    """fig3b's bin labels ("0.12–0.25" at 35 degrees, three panels abreast) crowded: the bins
    sit on a numeric axis whose ticks are the bin edges, labelled with just enough digits."""
    for name in ("fig3b_heterogeneity", "fig3c_difficulty"):
        for ax in drawn[name].axes:
            labels = _ticks(ax)
            assert len(set(labels)) == len(labels) <= 6, labels
            assert all(len(t) <= 5 for t in labels), labels
            assert {t.get_rotation() for t in ax.get_xticklabels()} == {0.0}


# ------------------------------------------------------------ what the figures warn of


def _edited(results, tmp_path, table: str, edit) -> object:
    """``results`` copied with ``table`` rewritten by ``edit`` (a polars frame function)."""
    folder = tmp_path / "res"
    shutil.copytree(results, folder)
    edit(pl.read_csv(folder / table)).write_csv(folder / table)
    return folder


def test_every_bin_shows_its_count_and_thin_and_empty_bins_are_marked(results, tmp_path):
    """fig3c's A*-PO dip was a bin of 13 estimates, with no count on the figure, and an empty
    bin was dropped unsaid: each bin's count sits above it, red and shaded under THIN_BIN,
    "empty" and hatched at 0."""
    import matplotlib.pyplot as plt

    def thin_and_empty(df):
        early = pl.col("checkpoint") == "early"
        return df.with_columns(
            pl.when(early & (pl.col("bin") == 4)).then(0)
            .when(early & (pl.col("bin") == 3)).then(THIN_BIN - 1)
            .otherwise(pl.col("n_estimates")).alias("n_estimates"),
            pl.when(early & (pl.col("bin") == 4)).then(None).otherwise(pl.col("mse")).alias("mse"),
        )  # fmt: skip

    folder = _edited(results, tmp_path, "by_difficulty.csv", thin_and_empty)
    table = pl.read_csv(folder / "by_difficulty.csv").filter(pl.col("estimator") == "basis")
    fig = FIGURES["fig3c_difficulty"][1](folder)
    for ax, name in zip(fig.axes, _checkpoints(folder, "by_difficulty.csv"), strict=True):
        counts = table.filter(pl.col("checkpoint") == name).sort("bin")["n_estimates"].to_list()
        (top,) = ax.child_axes
        labels = top.get_xticklabels()
        assert [t.get_text() for t in labels] == [str(n) if n else "empty" for n in counts]
        assert [t.get_color() == "tab:red" for t in labels] == [n < THIN_BIN for n in counts]
        shaded = sorted(round(p.get_x(), 6) for p in ax.patches)  # one span per thin bin
        assert shaded == [round(0.2 * i, 6) for i, n in enumerate(counts) if n < THIN_BIN]
    early = fig.axes[0]
    assert [p.get_hatch() for p in early.patches if p.get_x() > 0.7] == ["///"]  # the empty bin
    assert "estimates per bin" in fig.get_suptitle()
    plt.close(fig)


def test_zero_bars_are_drawn_and_labelled(results, drawn):
    """fig3d's 0% bars were invisible, as if missing, then thick stubs that read as small
    shares: each is a hollow marker on the axis and no bar, and each estimator with one
    says 0%."""
    summary = pl.read_csv(results / "summary.csv")
    (ax,) = drawn["fig3d_extreme"].axes
    hollow = [line for line in ax.get_lines() if line.get_markerfacecolor() == "none"]
    assert all(list(line.get_ydata()) == [0] * len(line.get_ydata()) for line in hollow)
    n_zero = summary.filter(pl.col("extreme_rate") == 0).height
    assert sum(len(line.get_ydata()) for line in hollow) == n_zero > 0
    assert sum(bar.get_height() > 0 for bar in ax.patches) == summary.height - n_zero
    zero = summary.group_by("estimator").agg((pl.col("extreme_rate") == 0).any().alias("z"))
    assert sum(t.get_text().startswith("0%") for t in ax.texts) == zero["z"].sum()


def test_mse_bars_go_on_a_log_axis_where_they_span_decades(results, tmp_path):
    """fig3a's linear axis hid bars of 0.003 beside 0.44."""
    import matplotlib.pyplot as plt

    def scaled(factor):
        def edit(df):
            small = pl.col("estimator") == "grpo"
            return df.with_columns(
                pl.when(small).then(pl.col(c) * factor).otherwise(pl.col(c)).alias(c)
                for c in ("mse", "ci_low", "ci_high")
            )

        return edit

    summary = pl.read_csv(results / "summary.csv").filter(pl.col("estimator") != "vanilla")
    span = summary["mse"].max() / summary["mse"].min()
    for factor, scale in ((1.0, "log" if span >= LOG_SPAN else "linear"), (1e-3, "log")):
        fig = FIGURES["fig3a_mse"][1](_edited(results, tmp_path / str(factor), "summary.csv",
                                               scaled(factor)))  # fmt: skip
        assert fig.axes[0].get_yscale() == scale
        plt.close(fig)


def test_sensitivity_draws_its_intervals_and_says_when_a_knob_never_binds(results, tmp_path):
    """fig5's eps panel was flat because eps never binds on this data, and the figure did not
    say so, nor draw the intervals sensitivity.csv has."""
    import matplotlib.pyplot as plt

    def eps_flat(df):
        first = df.group_by("checkpoint", "parameter").agg(pl.col("mse").first().alias("m"))
        df = df.join(first, on=["checkpoint", "parameter"])
        eps = pl.col("parameter") == "eps"
        return df.with_columns(
            pl.when(eps).then(pl.col("m")).otherwise(pl.col("mse")).alias("mse")
        ).drop("m")

    def eps_moves(df):
        eps = pl.col("parameter") == "eps"
        return df.with_columns(
            pl.when(eps)
            .then(pl.col("mse") * (1 + pl.col("value")))
            .otherwise(pl.col("mse"))
            .alias("mse")
        )

    table = pl.read_csv(results / "sensitivity.csv")
    for edit, binds in ((eps_flat, False), (eps_moves, True)):
        fig = FIGURES["fig5_sensitivity"][1](
            _edited(results, tmp_path / str(binds), "sensitivity.csv", edit)
        )
        eps_ax, n_ax = fig.axes[:2]
        assert ("never binds" in eps_ax.get_xlabel()) is not binds
        assert "never binds" not in n_ax.get_xlabel()  # the cache size does move the MSE
        plt.close(fig)
    fig = FIGURES["fig5_sensitivity"][1](results)
    n_ax = fig.axes[1]
    rows = table.filter((pl.col("parameter") == "ref_n") & (pl.col("checkpoint") == "late"))
    bars = n_ax.containers[-1]  # the last checkpoint's error bars
    (segments,) = bars.lines[2]
    spans = sorted(float(end[1]) for segment in segments.get_segments() for end in segment)
    expected = sorted([*rows["ci_low"].to_list(), *rows["ci_high"].to_list()])
    assert spans == pytest.approx(expected)
    plt.close(fig)


def test_every_mse_axis_says_raw_or_noise_corrected(drawn):
    """Some y labels said raw MSE, others the noise-corrected one, in different words."""
    for name in ("fig2_fixed_beta", "fig3a_mse", "fig3b_heterogeneity", "fig3c_difficulty",
                 "fig3_group_sweep", "fig5_sensitivity"):  # fmt: skip
        assert drawn[name].axes[0].get_ylabel() == RAW_MSE, name
    assert drawn["fig_trajectory"].axes[0].get_ylabel() == CORRECTED_MSE
