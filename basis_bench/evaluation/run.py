"""``basis-bench evaluate``: replay every checkpoint, write the tables and run.json.

Protocol (the paper's section 5.1 and appendix A), per checkpoint: split the samples into
oracle, pool and cache (:mod:`basis_bench.evaluation.dataset`), replay repeated batch draws
through every estimator (:mod:`basis_bench.evaluation.replay`), and summarise them
(:mod:`basis_bench.evaluation.tables`). Estimators that carry state across steps (the SPO
tracker, ``basis_memory``, ``basis_context``) have no one-step call: trajectory replay
(:mod:`basis_bench.evaluation.schedule`) runs every estimator, stateful or not, over the
checkpoints in training order and writes trajectory.csv, the only table of the stateful ones.

Options reach estimators typed: ``basis_options`` (the CLI's --calibration, --eps, ...)
go to every estimator whose options class is
:class:`~basis_bench.estimators.BasisOptions`, ``estimator_options`` carry
``{estimator: {key: value}}`` for any estimator, validated against its dataclass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from basis_bench.errors import InputError
from basis_bench.estimators import BasisOptions, Estimator, TiltTable, available, default_betas, get
from basis_bench.estimators.basis import BASIS_NAME
from basis_bench.estimators.table import grid_beta_index
from basis_bench.evaluation.config import EvaluateConfig, given, named
from basis_bench.evaluation.cost import check_memory, held_bytes
from basis_bench.evaluation.dataset import (
    CheckpointData,
    Dataset,
    checkpoint_data,
    open_dataset,
    smallest_checkpoint,
)
from basis_bench.evaluation.gradient import REFERENCE_ARM, has_sketches
from basis_bench.evaluation.oracle_noise import noise_warning
from basis_bench.evaluation.record import RUN_FILE, RunRecord
from basis_bench.evaluation.replay import CHUNK_REPEATS, ESTIMATES_SCHEMA, ReplaySettings, replay
from basis_bench.evaluation.replay_plan import small_pages
from basis_bench.evaluation.schedule import (
    TRAJECTORY_REPEATS,
    Schedule,
    gradient_table,
    replay_schedule,
    schedule_record,
    trajectory_schedule,
)
from basis_bench.evaluation.tables import (
    beta_table,
    claim_results_dir,
    difficulty_table,
    fixed_beta_table,
    g_sweep_table,
    heterogeneity_table,
    new_run_id,
    staged_run,
    summary_table,
    write_csv,
)
from basis_bench.evaluation.trajectory import check_blend
from basis_bench.guards.outputs import (
    METADATA_KEY,
    atomic_write,
    holds_output_locks,
    json_text,
    naming_failed_writes,
    write_text_atomic,
)
from basis_bench.guards.provenance import __version__, file_sha256, provenance
from basis_bench.guards.work_limit import check_draws
from basis_bench.rollouts.features import check_feature_kind
from basis_bench.rollouts.fingerprint import dataset_sha256
from basis_bench.rollouts.store import load_prompts

TABLES = ("summary", "g_sweep", "by_heterogeneity", "by_difficulty", "beta_choice", "fixed_beta")
RUN_FILES = (
    *(f"{t}.csv" for t in TABLES),
    "trajectory.csv",
    "gradient.csv",
    "estimates.parquet",
    RUN_FILE,
)
"""The files of one evaluate run: a rerun replaces all of them, whichever it writes."""


def resolve_estimators(names: Iterable[str]) -> list[Estimator]:
    """Registered estimators by name (all of them, plug-ins included, for an empty list or
    ``all``), in registry order, else in the order named. Stateful estimators
    (``Estimator.stateful``) are in the list: evaluate gives them only the trajectory replay.
    """
    names = list(names)
    if not names or "all" in names:
        return list(available().values())
    return [get(n) for n in dict.fromkeys(names)]


def ran_estimators(cfg: EvaluateConfig) -> list[str]:
    """What ``cfg.estimators`` (``all`` or none named: every registered one) expanded to:
    the estimators the run replays, stateful ones only with the trajectory replay
    (run.json's ``config.estimators``)."""
    return [e.name for e in resolve_estimators(cfg.estimators) if cfg.trajectory or not e.stateful]


def resolve_options(
    estimators: Iterable[Estimator],
    basis_options: Mapping[str, Any],
    estimator_options: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, Any], BasisOptions]:
    """Each estimator's options object, and the BASIS options of the extras.

    ``basis_options`` go to every estimator with :class:`BasisOptions`; an estimator's own
    ``estimator_options`` entry overrides them. A name in ``estimator_options`` that is not
    registered, or not run (``basis`` always is: the extras use its options), or a key its
    options class lacks, is an InputError.
    """
    estimators = list(estimators)
    run = {est.name for est in estimators} | {BASIS_NAME}
    for name, values in estimator_options.items():
        get(name).parse_options(values)  # an unknown name or key first: the likelier slip
        if name not in run:
            raise InputError(
                f"{named('estimator_options')} {name}.KEY: {name} is not among the estimators "
                f"of this run, so the option would be unused; add {name} to "
                f"{named('estimators')} or drop the option"
            )
    options: dict[str, Any] = {}
    for est in estimators:
        shared = basis_options if est.options_class is BasisOptions else {}
        options[est.name] = est.parse_options({**shared, **estimator_options.get(est.name, {})})
    beta = get(BASIS_NAME).parse_options({**basis_options, **estimator_options.get(BASIS_NAME, {})})
    return options, beta


@dataclass(frozen=True)
class EvaluateResult:
    """One evaluate run: its tables as polars frames (what the CSV files of ``out`` hold) and
    its record (run.json). ``out`` is None for a run that wrote no files; ``trajectory`` is
    None with the trajectory replay off, ``gradient`` None without score sketches in the
    data (gradient.csv), ``estimates`` None unless ``write_estimates``."""

    out: Path | None
    summary: pl.DataFrame
    run: RunRecord
    trajectory: pl.DataFrame | None = None
    g_sweep: pl.DataFrame = field(default_factory=pl.DataFrame)
    by_heterogeneity: pl.DataFrame = field(default_factory=pl.DataFrame)
    by_difficulty: pl.DataFrame = field(default_factory=pl.DataFrame)
    beta_choice: pl.DataFrame = field(default_factory=pl.DataFrame)
    fixed_beta: pl.DataFrame = field(default_factory=pl.DataFrame)
    estimates: pl.DataFrame | None = None
    gradient: pl.DataFrame | None = None


class _EstimatesWriter:
    """Streams chunks of estimates into one Parquet file, renamed into place when closed."""

    def __init__(self, path: Path, metadata: dict[str, Any]) -> None:
        self.path = path
        self._atomic = atomic_write(path)
        tmp = self._atomic.__enter__()
        schema = ESTIMATES_SCHEMA.with_metadata(
            {METADATA_KEY: json_text(metadata, sort_keys=True, default=str)}
        )
        self.writer = pq.ParquetWriter(tmp, schema, compression="zstd")

    def __call__(self, table: pa.Table) -> None:
        with naming_failed_writes(self.path):  # arrow's full disk names no file
            self.writer.write_table(table.replace_schema_metadata(self.writer.schema.metadata))

    def close(self, error: BaseException | None = None) -> None:
        """Finish the file (or, after ``error``, remove it and keep any earlier one); a
        write that fails as the file is finished removes it too, and is raised."""
        failed = error
        try:
            with naming_failed_writes(self.path):
                self.writer.close()
        except Exception as err:  # a full disk as the last row group is flushed
            failed = failed or err
        if failed is None:
            self._atomic.__exit__(None, None, None)
            return
        self._atomic.__exit__(type(failed), failed, failed.__traceback__)
        if error is None:
            raise failed


def _run_record(
    cfg: EvaluateConfig, ds: Dataset, estimators: list[Estimator], options: Mapping[str, Any],
    betas: Any, datas: list[CheckpointData],
) -> RunRecord:  # fmt: skip
    rollouts = str(ds.root.resolve())  # one spelling: figures compares the two records
    return RunRecord(
        package_version=__version__,
        provenance=provenance(),
        rollouts=rollouts,
        dataset_label=ds.label,
        dataset_sha256=dataset_sha256(ds.root),
        simulated=ds.simulated,
        synthetic_order_policies=ds.synthetic_order,
        reference=ds.reference,
        config={**asdict(cfg), "rollouts": rollouts, "estimators": ran_estimators(cfg)},
        estimators=[e.name for e in estimators],
        estimator_options={name: asdict(opts) for name, opts in options.items()},
        betas=[float(x) for x in betas],
        chunk_repeats=CHUNK_REPEATS,
        estimates="one row per (repeat, prompt, estimator); for group estimators sq_err is the mean "
        "over the G rollouts' baselines and estimate is the first rollout's baseline",
        checkpoints={
            d.name: {
                "prompts": d.n_prompts,
                "dropped_no_reference": d.dropped_no_reference,
                "min_pool": int(d.pool_count.min()),
            }
            for d in datas
        },
    )


def _replay_all(
    cfg: EvaluateConfig,
    datas: list[CheckpointData],
    estimators: list[Estimator],
    settings: ReplaySettings,
    writer: Callable[[pa.Table], None] | None,
    progress: Callable[[str, int, int], None] | None,
) -> dict[str, list[pl.DataFrame]]:
    """Every checkpoint's replay, summarised into the tables (one frame per checkpoint)."""
    betas = default_betas(cfg.grid_size)
    tables: dict[str, list[pl.DataFrame]] = {k: [] for k in TABLES}
    for d in datas if estimators else ():  # only the SPO tracker asked for
        done = 0

        def tick(n: int, name: str = d.name) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(name, done, cfg.repeats)

        rep = replay(d, TiltTable.from_cache(d.cache, betas), estimators, settings, writer, tick)
        tables["summary"].append(summary_table(rep, cfg.batch))
        tables["g_sweep"].append(g_sweep_table(rep, cfg.batch))
        tables["by_heterogeneity"].append(heterogeneity_table(rep))
        tables["by_difficulty"].append(difficulty_table(rep))
        tables["beta_choice"].append(beta_table(rep))
        tables["fixed_beta"].append(fixed_beta_table(rep))
    return tables


def check_reward_bounds(ds: Dataset, estimators: list[Estimator]) -> None:
    """The data's rewards against the bounds estimators declare (``reward_bounds``: the Beta
    posteriors of the SPO tracker and ``basis_memory`` need [0, 1]), before any replay; the
    error names the estimators to drop and the list to keep."""
    bounds = [b for p in (ds.reference, *ds.checkpoints) if (b := ds.rewards[p].reward_bounds())]
    if not bounds:
        return
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    unfit: dict[tuple[float, float], list[str]] = {}
    for e in estimators:
        if e.reward_bounds is not None and not e.reward_bounds[0] <= lo <= hi <= e.reward_bounds[1]:
            unfit.setdefault(e.reward_bounds, []).append(e.name)
    if not unfit:
        return
    names = [n for group in unfit.values() for n in group]
    others = [e.name for e in estimators if e.name not in names]
    keep = given("estimators", tuple(others)) if others else "another estimator"
    needs = "; ".join(f"[{a:g}, {b:g}], which {', '.join(g)} need" for (a, b), g in unfit.items())
    raise InputError(
        f"rewards lie in [{lo:g}, {hi:g}], outside {needs}; drop {', '.join(names)}: {keep}"
    )


def _check_run(cfg: EvaluateConfig, estimators: list[Estimator]) -> tuple[Dataset, Schedule]:
    """Every check that needs no replay, before any folder is made; the dataset opened and
    the trajectory's schedule (the epoch schedule, unused, without the trajectory replay)."""
    basis = BasisOptions(**cfg.basis_options)
    if basis.calibration == "fixed":
        grid_beta_index(default_betas(cfg.grid_size), basis.fixed_beta)  # type: ignore[arg-type]
    ds = open_dataset(cfg.rollouts, cfg.reference, cfg.checkpoints)
    if cfg.trajectory and cfg.trajectory_blend:
        check_blend(cfg.trajectory_epochs, len(ds.checkpoints))
    schedule = Schedule("epochs", [])
    if cfg.trajectory:
        check_feature_kind(load_prompts(ds.root), cfg.features)
        schedule = trajectory_schedule(cfg, ds, estimators)
    check_reward_bounds(ds, [e for e in estimators if cfg.trajectory or not e.stateful])
    chosen = bool(cfg.estimators) and "all" not in cfg.estimators  # "all" drops them quietly
    stateful = [e.name for e in estimators if e.stateful]
    if chosen and stateful and not cfg.trajectory:  # were dropped silently; alone, an empty run
        off = given("trajectory", False)
        raise InputError(
            f"{', '.join(stateful)}: stateful, run only in the trajectory replay, which "
            f"{off} turns off; drop {off}, or drop them from {named('estimators')}"
        )
    return ds, schedule


@holds_output_locks
@small_pages()
def evaluate(
    cfg: EvaluateConfig,
    out: str | os.PathLike[str] | None,
    progress: Callable[[str, int, int], None] | None = None,
) -> EvaluateResult:
    """Run the benchmark; write its files to ``out`` unless it is None.

    Files: estimates.parquet (with ``cfg.write_estimates``), summary.csv, g_sweep.csv,
    by_heterogeneity.csv, by_difficulty.csv, beta_choice.csv, fixed_beta.csv,
    trajectory.csv (unless ``cfg.trajectory`` is false) and run.json (settings, each
    estimator's options, dataset label, prompts per checkpoint, prompts dropped for lack of
    a reference sample, provenance). Without ``out`` the same frames are returned and
    nothing is written (the estimates kept in memory with ``cfg.write_estimates``).
    ``progress(checkpoint, done, total)`` is called after each chunk of repeats.
    """
    estimators = resolve_estimators(cfg.estimators)
    options, beta_options = resolve_options(estimators, cfg.basis_options, cfg.estimator_options)
    ds, schedule = _check_run(cfg, estimators)
    cfg = cfg.fit(
        *smallest_checkpoint(ds), ds.rewards[ds.reference].matrix.shape[1]
    )  # the defaults left to the data, as run.json has them
    one_step = [e for e in estimators if not e.stateful]
    has_group = any(e.group for e in one_step)
    group = cfg.group_size if has_group else 1
    check_draws(  # before the claim: a count that fits in memory may still never end
        "this evaluate run", named("repeats"), cfg.repeats,
        len(ds.checkpoints) * cfg.batch * group * max(len(one_step), 1),
    )  # fmt: skip
    if out is not None:
        out = claim_results_dir(out, ds.root)
    settings = ReplaySettings(
        cfg.batch, cfg.repeats, cfg.group_size, cfg.seed, options, beta_options
    )
    min_pool = cfg.group_size if has_group else 1
    datas = [checkpoint_data(ds, c, cfg.oracle, cfg.cache_n, min_pool) for c in ds.checkpoints]
    streams = min(cfg.repeats, TRAJECTORY_REPEATS) if cfg.trajectory else 0
    check_memory(max(d.n_prompts for d in datas), held_bytes(ds.rewards, datas), streams)
    run = _run_record(cfg, ds, one_step, options, default_betas(cfg.grid_size), datas)
    replayed = _Replayed(cfg, ds, schedule, datas, estimators, options, settings)
    if out is None:
        kept: list[pa.Table] = []
        frames, run = replayed.run(run, kept.append if cfg.write_estimates else None, progress)
        estimates = pl.from_arrow(pa.concat_tables(kept, promote_options="none")) if kept else None
        return _result(None, frames, run, estimates if cfg.write_estimates else None)
    # One run, all or nothing: written into a hidden sibling folder and swapped in whole.
    with staged_run(out, RUN_FILES) as stage:
        frames = _write_run(replayed, run, stage, progress)
        run = RunRecord.read(stage / RUN_FILE)
    return _result(out, frames, run, None)


def _result(
    out: Path | None, frames: dict[str, pl.DataFrame], run: RunRecord, estimates: Any
) -> EvaluateResult:
    tables = {k: frames[k] for k in TABLES if k != "summary"}
    return EvaluateResult(
        out, frames["summary"], run, frames.get("trajectory"), estimates=estimates,
        gradient=frames.get("gradient"), **tables,
    )  # fmt: skip


@dataclass
class _Replayed:
    """What one run replays: the settings, the dataset and its checkpoints' data."""

    cfg: EvaluateConfig
    ds: Dataset
    schedule: Schedule
    datas: list[CheckpointData]
    estimators: list[Estimator]
    options: Mapping[str, Any]
    settings: ReplaySettings

    def run(
        self,
        run: RunRecord,
        sink: Callable[[pa.Table], None] | None,
        progress: Callable[[str, int, int], None] | None,
    ) -> tuple[dict[str, pl.DataFrame], RunRecord]:
        """Every table of the run, the estimates' chunks fed to ``sink``, and the record with
        the trajectory's part. Stateful estimators have no one-step call: they appear in the
        trajectory replay only. ``datas`` is emptied once the one-step replay is done, so its
        arrays are not held through the trajectory replay."""
        cfg = self.cfg
        one_step = [e for e in self.estimators if not e.stateful]
        tables = (
            _replay_all(cfg, self.datas, one_step, self.settings, sink, progress)
            if one_step
            else {k: [] for k in TABLES}
        )
        self.datas.clear()  # the checkpoints' arrays, freed: the trajectory replay builds its own
        frames = {k: _concat(v) for k, v in tables.items()}
        if cfg.trajectory:
            frames["trajectory"] = replay_schedule(
                cfg, self.ds, self.schedule, self.estimators, self.options, progress
            )
            run = replace(run, trajectory={
                "checkpoint_order": self.ds.checkpoints,
                "repeats": min(cfg.repeats, TRAJECTORY_REPEATS),
                **schedule_record(cfg, self.ds, self.schedule),
                "features": cfg.features,
                "estimators": frames["trajectory"]["estimator"].unique(maintain_order=True).to_list(),
            })  # fmt: skip
            if self.schedule.kind == "steps" and has_sketches(self.ds.root):
                frames["gradient"] = gradient_table(
                    cfg, self.ds, self.schedule, self.estimators, self.options, progress
                )
                run = replace(run, trajectory={
                    **(run.trajectory or {}), "gradient_budgets": cfg.budgets,
                    "gradient_reference": f"{REFERENCE_ARM}({cfg.group_size})",
                })  # fmt: skip
        return frames, replace(run, warnings=_warnings(frames, cfg.oracle))


def _write_run(
    replayed: _Replayed,
    run: RunRecord,
    stage: Path,
    progress: Callable[[str, int, int], None] | None,
) -> dict[str, pl.DataFrame]:
    """Replay, and write every file of the run into ``stage``; run.json last, with the run id
    and the sha256 of every table (what `figures` checks)."""
    # Provenance (date, argv) lives in run.json only, so the same seed writes the same Parquet.
    reproducible = {k: v for k, v in asdict(run).items() if k != "provenance" and v is not None}
    write = replayed.cfg.write_estimates
    writer = _EstimatesWriter(stage / "estimates.parquet", reproducible) if write else None
    try:
        frames, run = replayed.run(run, writer, progress)
    except BaseException as exc:
        if writer is not None:
            writer.close(exc)
        raise
    if writer is not None:
        writer.close()
    files = []
    for name, df in frames.items():
        if df.height:
            write_csv(df, stage / f"{name}.csv")
            files.append(f"{name}.csv")
    if write:
        files.append("estimates.parquet")
    run = replace(run, run_id=new_run_id(), tables={f: file_sha256(stage / f) for f in files})
    write_text_atomic(stage / RUN_FILE, run.to_json())
    return frames


def _warnings(frames: dict[str, pl.DataFrame], oracle_n: int) -> list[str]:
    """The run's warnings (run.json's ``warnings``): the oracle's noise rivalling the MSE it
    corrects, in the one-step tables or the trajectory replay's per-checkpoint rows."""
    columns = ["checkpoint", "estimator", "mse", "mse_noise_corrected"]
    parts = [frames["summary"].select(columns)] if frames["summary"].height else []
    trajectory = frames.get("trajectory")
    if trajectory is not None and trajectory.height:
        rows = trajectory.filter(pl.col("scope") == "checkpoint").select(columns)
        parts.append(rows.with_columns(pl.format("{} (trajectory)", "checkpoint")))
    warning = noise_warning(pl.concat(parts), oracle_n) if parts else None
    return [warning] if warning else []


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame:
    kept = [t for t in frames if t.height]
    return pl.concat(kept) if kept else pl.DataFrame()


__all__ = [
    "RUN_FILES",
    "TABLES",
    "TRAJECTORY_REPEATS",
    "EvaluateConfig",
    "EvaluateResult",
    "evaluate",
    "resolve_estimators",
    "resolve_options",
]
