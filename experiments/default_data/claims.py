"""The MSE table and the paper's value-estimation claims beside what a results folder
shows, as markdown.

Reads the tables of ``basis-bench evaluate`` and ``basis-bench sensitivity`` written to the
same folder (summary.csv, g_sweep.csv, by_heterogeneity.csv, by_difficulty.csv,
fixed_beta.csv, sensitivity.csv) and prints one row per claim and checkpoint, with the
noise-corrected MSEs the verdict rests on; before that, the MSE of every estimator per
checkpoint (noise-corrected, with the 95% half-width and the share of 0/1 baselines). Every
number of docs/results.md's "real default" section comes from this script. The folder is
read only if its tables are the ones its run.json and sensitivity.json record.

    basis-bench evaluate --estimators all --out results/default
    basis-bench sensitivity --out results/default
    python experiments/default_data/claims.py results/default
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from basis_bench.errors import InputError
from basis_bench.estimators.baselines import GRPO_NAME, REINFORCE_PP_NAME, RLOO_NAME
from basis_bench.estimators.basis import BASIS_NAME, BASIS_PAPER_NAME
from basis_bench.evaluation.record import RunRecord, check_one_run, sensitivity_mismatch

MSE = "mse_noise_corrected"
MIN_SHARE = 0.05  # bins holding less than this share of the batches (estimates) are left out


def _rows(table: pl.DataFrame, ck: str, est: str) -> pl.DataFrame:
    return table.filter((pl.col("checkpoint") == ck) & (pl.col("estimator") == est))


def _value(summary: pl.DataFrame, ck: str, est: str, column: str = MSE) -> float:
    """One cell of summary.csv (default: the noise-corrected MSE)."""
    return float(_rows(summary, ck, est)[column][0])


def _kept_bins(table: pl.DataFrame, ck: str, est: str, count: str) -> pl.DataFrame:
    """The bins of one checkpoint and estimator holding at least MIN_SHARE of ``count``."""
    sub = _rows(table, ck, est)
    return sub.filter(pl.col(count) >= MIN_SHARE * sub[count].sum()).sort("bin")


def _bins(table: pl.DataFrame, ck: str, est: str, count: str) -> list[float]:
    return [float(x) for x in _kept_bins(table, ck, est, count)[MSE]]


def _edges(table: pl.DataFrame, ck: str, est: str, count: str) -> list[str]:
    sub = _kept_bins(table, ck, est, count)
    return [f"[{lo:.1f}, {hi:.1f})" for lo, hi in zip(sub["bin_low"], sub["bin_high"], strict=True)]


def _span(values: list[float]) -> str:
    return f"{min(values):.4f}-{max(values):.4f} (x{max(values) / min(values):.1f})"


def mse_table(folder: Path) -> list[str]:
    """One row per estimator: noise-corrected MSE +- 95% half-width per checkpoint."""
    summary = pl.read_csv(folder / "summary.csv")
    cks = summary["checkpoint"].unique(maintain_order=True).to_list()
    rows = [
        "| estimator | G | " + " | ".join(cks) + " | 0/1 baselines |",
        "| --- | --- | " + "--- | " * len(cks) + "--- |",
    ]
    for est in summary["estimator"].unique(maintain_order=True):
        sub = summary.filter(pl.col("estimator") == est)
        cells, extreme = [], []
        for ck in cks:
            r = sub.filter(pl.col("checkpoint") == ck).row(0, named=True)
            cells.append(f"{r[MSE]:.4f} ± {(r['ci_high'] - r['ci_low']) / 2:.4f}")
            extreme.append(f"{100 * r['extreme_rate']:.0f}%")
        g = sub["rollouts_per_prompt"][0]
        rows.append(f"| {est} | {g} | " + " | ".join(cells) + f" | {' / '.join(extreme)} |")
    return rows


def claims(folder: Path) -> list[str]:
    summary = pl.read_csv(folder / "summary.csv")
    het = pl.read_csv(folder / "by_heterogeneity.csv")
    diff = pl.read_csv(folder / "by_difficulty.csv")
    fixed = pl.read_csv(folder / "fixed_beta.csv")
    sens = pl.read_csv(folder / "sensitivity.csv")
    rows = ["| claim (paper) | checkpoint | here |", "| --- | --- | --- |"]
    for ck in summary["checkpoint"].unique(maintain_order=True):
        b, rpp = _value(summary, ck, BASIS_NAME), _value(summary, ck, REINFORCE_PP_NAME)
        paper = _value(summary, ck, BASIS_PAPER_NAME)
        g8, r8 = _value(summary, ck, GRPO_NAME), _value(summary, ck, RLOO_NAME)
        d_b = [f"{v:.4f}" for v in _bins(diff, ck, BASIS_NAME, "n_estimates")]
        d_g = [f"{v:.4f}" for v in _bins(diff, ck, GRPO_NAME, "n_estimates")]
        d_edges = " / ".join(_edges(diff, ck, BASIS_NAME, "n_estimates"))
        f = fixed.filter(pl.col("checkpoint") == ck)
        init = float(f["initial_mse_noise_corrected"].min())
        refined = float(f["refined_mse_noise_corrected"].min())
        n = sens.filter(
            (pl.col("checkpoint") == ck) & (pl.col("parameter").is_in(["ref_n", "n"]))
        ).sort("value")
        cache = ", ".join(f"{int(v)}: {m:.4f}" for v, m in zip(n["value"], n[MSE], strict=True))
        rows += [
            f"| BASIS cuts REINFORCE++'s MSE by 69% | {ck} | basis {b:.4f} vs R++ {rpp:.4f}: "
            f"{100 * (1 - b / rpp):.0f}% (basis_paper {100 * (1 - paper / rpp):.0f}%) |",
            f"| BASIS (1 rollout) beats GRPO and RLOO (8) | {ck} | basis {b:.4f} vs GRPO(8) "
            f"{g8:.4f}, RLOO(8) {r8:.4f}: {'yes' if b < min(g8, r8) else 'no'} |",
            f"| BASIS flat across heterogeneity, R++ nearly doubles | {ck} | basis "
            f"{_span(_bins(het, ck, BASIS_NAME, 'n_batches'))}; R++ "
            f"{_span(_bins(het, ck, REINFORCE_PP_NAME, 'n_batches'))} |",
            f"| BASIS flat across difficulty, GRPO worst on medium | {ck} | value bins {d_edges}: "
            f"basis {' / '.join(d_b)}; GRPO(8) {' / '.join(d_g)} |",
            f"| BASIS never returns a 0/1 baseline | {ck} | basis "
            f"{100 * _value(summary, ck, BASIS_NAME, 'extreme_rate'):.1f}%, GRPO(8) "
            f"{100 * _value(summary, ck, GRPO_NAME, 'extreme_rate'):.0f}%, RLOO(8) "
            f"{100 * _value(summary, ck, RLOO_NAME, 'extreme_rate'):.0f}% |",
            f"| larger cache n helps (8 -> 64) | {ck} | basis by n: {cache} |",
            f"| refined V~ beats initial V^ (Fig. 2) | {ck} | best fixed beta: initial "
            f"{init:.4f}, refined {refined:.4f} |",
        ]
    return rows


def check_folder(folder: Path) -> RunRecord:
    """run.json of ``folder``, once every table there is known to belong to that run and
    sensitivity.csv to the same data (an InputError says which is not)."""
    run = check_one_run(folder)
    mismatch = sensitivity_mismatch(folder, run)
    if mismatch is not None:
        raise InputError(mismatch)
    return run


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    try:
        check_folder(folder)
    except InputError as err:
        sys.exit(f"error: {err}")
    print("\n".join([*mse_table(folder), "", *claims(folder)]))
