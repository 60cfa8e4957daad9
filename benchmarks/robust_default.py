"""The robust-default comparison of issue 13: every BASIS-family estimator against `offline`
at small and large batches, on any rollouts directory.

For each dataset (a rollouts directory in the store schema), each checkpoint and each batch
size B, this runs ``basis-bench evaluate`` (the same replay, the same seeded batch draws for
every estimator) and reports per estimator:

- ``mse_nc``: the noise-corrected MSE against the oracle, and ``ci``, the half-width of its
  95% normal interval over repeats (both from summary.csv);
- ``d_off`` / ``d_ci``: the paired difference of the batch MSE to ``offline``'s on the same
  draws, its mean and 95% half-width (the oracle noise cancels in a difference);
  ``worse`` is true when the whole interval lies above 0, i.e. significantly worse than
  ``offline``;
- ``extreme``: the share of baselines exactly 0 or 1.

Written: ``OUT/robust.csv`` (one row per dataset x checkpoint x B x estimator) and
``OUT/robust.md`` (one markdown table of MSEs and one of the basis-vs-offline checks).

    python benchmarks/robust_default.py --data math500=/tmp/robust/math500/rollouts@112 \\
        --data noisy=/tmp/robust/sim_noisy --out /tmp/robust/table

``--data LABEL=DIR[@ORACLE_N]``: the oracle size defaults to 256; ``--ref-n`` (64) is shared.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.estimators.refine import Z_95

ESTIMATORS = (
    "basis",
    "basis_paper",
    "offline",
    "basis_vop",
    "basis_rvg",
    "reference_mean",
    "reinforce_pp",
    "grpo",
)
BATCH_SIZES = (8, 16, 32, 64, 256)


def _paired(est: pl.DataFrame, name: str, against: str = "offline") -> tuple[float, float]:
    """Mean and 95% half-width of the per-repeat batch-MSE difference name - against."""
    per = (
        est.filter(pl.col("estimator").is_in([name, against]))
        .group_by("repeat", "estimator")
        .agg(pl.col("sq_err").mean())
        .pivot("estimator", index="repeat", values="sq_err")
    )
    if name == against or name not in per.columns or against not in per.columns:
        return 0.0, 0.0
    d = (per[name] - per[against]).to_numpy()
    return float(d.mean()), float(Z_95 * d.std(ddof=1) / math.sqrt(len(d)))


def measure(
    label: str, rollouts: str, batch: int, names: tuple[str, ...], args: argparse.Namespace,
    oracle_n: int, ref_n: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """One evaluate run of ``names`` at batch size ``batch``; one row per checkpoint x estimator."""
    from basis_bench.evaluation.config import EvaluateConfig
    from basis_bench.evaluation.run import evaluate

    with tempfile.TemporaryDirectory() as tmp:
        cfg = EvaluateConfig(
            rollouts=rollouts, estimators=names, batch_size=batch, repeats=args.repeats,
            oracle_n=oracle_n, ref_n=ref_n, seed=args.seed,
        )  # fmt: skip
        res = evaluate(cfg, tmp)
        est = pl.read_parquet(Path(tmp) / "estimates.parquet")
    rows = []
    for s in res.summary.iter_rows(named=True):
        e = est.filter(pl.col("checkpoint") == s["checkpoint"])
        d, dci = _paired(e, s["estimator"]) if "offline" in names else (math.nan, math.nan)
        rows.append({
            "dataset": label, "checkpoint": s["checkpoint"], "B": batch,
            "estimator": s["estimator"], "G": s["rollouts_per_prompt"],
            "mse_nc": s["mse_noise_corrected"], "ci": (s["ci_high"] - s["ci_low"]) / 2,
            "d_off": d, "d_ci": dci, "worse": bool(d - dci > 0),
            "extreme": s["extreme_rate"],
        })  # fmt: skip
    return rows


def markdown(df: pl.DataFrame) -> str:
    """Two markdown tables: MSE (± CI) per estimator, and basis vs offline."""
    names = list(dict.fromkeys(df["estimator"]))
    head = "| data | checkpoint | B | " + " | ".join(names) + " |"
    lines = [head, "| " + " | ".join(["---"] * (3 + len(names))) + " |"]
    for key, g in df.group_by(["dataset", "checkpoint", "B"], maintain_order=True):
        cells = {
            r["estimator"]: f"{r['mse_nc']:.4f} ±{r['ci']:.4f}" for r in g.iter_rows(named=True)
        }
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | "
            + " | ".join(cells.get(n, "") for n in names)
            + " |"
        )
    lines += ["", "| data | checkpoint | B | estimator | minus offline (paired, 95%) | worse? | 0/1 baselines |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in df.filter(pl.col("estimator").str.starts_with("basis")).iter_rows(named=True):
        lines.append(
            f"| {r['dataset']} | {r['checkpoint']} | {r['B']} | {r['estimator']} | "
            f"{r['d_off']:+.5f} ±{r['d_ci']:.5f} | {'WORSE' if r['worse'] else 'no'} | "
            f"{100 * r['extreme']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", action="append", default=[], metavar="LABEL=DIR")
    parser.add_argument("--ref-n", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--repeats", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/robust-default")
    args = parser.parse_args()
    from basis_bench.estimators import available

    known = available()
    names = tuple(n for n in args.estimators.split(",") if n in known)
    rows: list[dict[str, Any]] = []
    for spec in args.data:
        label, _, path = spec.partition("=")
        rollouts, _, n = path.partition("@")
        oracle_n = int(n) if n else 256
        for b in args.batch_sizes:
            rows += measure(label, rollouts, b, names, args, oracle_n, args.ref_n)
            print(f"{label} B={b} done", flush=True)
    df = pl.DataFrame(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.write_csv(out / "robust.csv")
    (out / "robust.md").write_text(markdown(df))
    bad = df.filter((pl.col("estimator") == "basis") & (pl.col("worse") | (pl.col("extreme") > 0)))
    print(markdown(df))
    print(f"basis worse than offline or 0/1 baseline in {bad.height} of "
          f"{df.filter(pl.col('estimator') == 'basis').height} cells")  # fmt: skip


if __name__ == "__main__":
    main()
