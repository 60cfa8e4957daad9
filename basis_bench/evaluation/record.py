"""The records a results folder keeps of the run that wrote it, and their integrity checks.

``run.json`` (:class:`RunRecord`, written last by ``basis-bench evaluate``) says what was
run (settings, estimators and their options, the dataset, prompts per checkpoint,
provenance) and names every table it wrote with its sha256, under one run id;
``sensitivity.json`` (:class:`SensitivityRecord`) does the same for ``sensitivity.csv``.
``figures`` and ``experiments/default_data/claims.py`` read a folder only after
:func:`check_one_run`: a table left from another run, or changed since, is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from basis_bench.errors import InputError
from basis_bench.guards import bounded_json
from basis_bench.guards.folders import read_small
from basis_bench.guards.outputs import json_text

RUN_FILE = "run.json"
SENSITIVITY_FILE = "sensitivity.json"
EVALUATE_TABLES = (
    "summary.csv", "g_sweep.csv", "by_heterogeneity.csv", "by_difficulty.csv",
    "beta_choice.csv", "fixed_beta.csv", "trajectory.csv",
)  # fmt: skip
"""The tables of ``evaluate`` that figures read, checked against the checksums run.json
records (it records estimates.parquet's too)."""


def _to_json(record: Any) -> str:
    """Sorted, indented JSON of a record; keys whose value is None (not recorded) left out,
    an infinity (the beta grid's last, beta = inf) written as "inf" (:func:`~basis_bench.guards.outputs.finite`)."""
    data = {k: v for k, v in asdict(record).items() if v is not None}
    return json_text(json.loads(json_text(data, default=str)), indent=2, sort_keys=True) + "\n"


def _read_json(path: Path) -> dict[str, Any]:
    raw = read_small(path)  # a FIFO is one line, never a wait for a writer
    if raw is None:
        raise InputError(f"{path} does not exist; rerun the command")
    try:
        data = bounded_json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InputError(f"{path} is not a readable run record ({err}); rerun the command") from err
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a readable run record; rerun the command")
    return data


def _from_json(cls: Any, path: Path) -> Any:
    """A record of type ``cls`` from its file; keys it does not declare are ignored."""
    data = _read_json(path)
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError as err:  # a required key is missing
        raise InputError(f"{path} is not a complete run record ({err}); rerun the command") from err


@dataclass(frozen=True)
class RunRecord:
    """run.json: one run of ``basis-bench evaluate``.

    ``trajectory``: how the trajectory replay was run (None when it was not); ``run_id`` and
    ``tables`` ({file: sha256}) are set when the tables are written (None in records that
    predate run ids); ``warnings``: what the printed tables warned of (the oracle's noise
    rivalling the MSE it corrects: :mod:`~basis_bench.evaluation.oracle_noise`). Keys of older records (``tracker``: the SPO tracker's summary rows,
    before it joined the trajectory replay) are ignored.
    """

    package_version: str
    provenance: Mapping[str, Any]
    rollouts: str
    dataset_label: str
    simulated: bool
    reference: str
    config: Mapping[str, Any]
    estimators: Sequence[str]
    estimator_options: Mapping[str, Mapping[str, Any]]
    betas: Sequence[float]
    chunk_repeats: int
    estimates: str
    checkpoints: Mapping[str, Mapping[str, int]]
    synthetic_order_policies: Sequence[str] = ()
    trajectory: Mapping[str, Any] | None = None
    run_id: str | None = None
    tables: Mapping[str, str] | None = None
    dataset_sha256: str | None = None  # fingerprint.dataset_sha256; None before it existed
    warnings: Sequence[str] = ()

    def to_json(self) -> str:
        return _to_json(self)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> RunRecord:
        record: RunRecord = _from_json(cls, Path(path))
        return record


@dataclass(frozen=True)
class SensitivityRecord:
    """sensitivity.json: one run of ``basis-bench sensitivity``."""

    run_id: str
    rollouts: str
    dataset_label: str
    config: Mapping[str, Any]
    tables: Mapping[str, str]
    dataset_sha256: str | None = None

    def to_json(self) -> str:
        return _to_json(self)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> SensitivityRecord:
        record: SensitivityRecord = _from_json(cls, Path(path))
        return record


def check_tables(
    folder: Path, record: RunRecord | SensitivityRecord, names: Sequence[str], what: str
) -> None:
    """Every table ``names`` in ``folder`` is the one ``record`` lists, by sha256."""
    from basis_bench.guards.provenance import file_sha256

    listed = record.tables
    if listed is None:
        return  # written before run ids: nothing to check against
    if not isinstance(listed, Mapping):  # a hand-edited record: was a TypeError traceback
        raise InputError(
            f"{folder / what} is not a readable run record ('tables' is a "
            f"{type(listed).__name__}, not a map of table to sha256); rerun the command"
        )
    for name in names:
        path = folder / name
        if not path.exists():
            continue
        if not path.is_file():
            raise InputError(f"{path} is a folder, not a table; rerun the command that wrote it")
        if name not in listed:
            raise InputError(
                f"{path} is not part of the run recorded in {what} (run {record.run_id}): "
                "it is left from another run; rerun `basis-bench evaluate`"
            )
        if file_sha256(path) != listed[name]:
            raise InputError(
                f"{path} is not the table of the run recorded in {what} (changed or cut short "
                "since); rerun the command that wrote it"
            )


def check_one_run(results: str | os.PathLike[str]) -> RunRecord:
    """run.json of ``results``, after checking that every evaluate table there belongs to
    that run (the sha256 run.json records); an InputError names a table that does not, or
    says that ``results`` is missing, a file or no results folder."""
    results = Path(results)
    if results.exists() and not results.is_dir():
        raise InputError(
            f"{results} is a file, not a results folder; give the --out folder of "
            "`basis-bench evaluate`"
        )
    if not (results / "summary.csv").exists():
        where = "does not exist" if not results.exists() else "holds no summary.csv"
        raise InputError(
            f"no evaluate results: {results} {where}; run `basis-bench evaluate --out "
            f"{results}` first"
        )
    if not (results / RUN_FILE).exists():
        raise InputError(
            f"{results} has tables but no run.json (an interrupted or foreign run); rerun "
            f"`basis-bench evaluate --out {results}`"
        )
    run = RunRecord.read(results / RUN_FILE)
    check_tables(results, run, EVALUATE_TABLES, RUN_FILE)
    return run


def sensitivity_mismatch(results: Path, run: RunRecord) -> str | None:
    """Why this folder's sensitivity.csv cannot be read with its evaluate tables, or None
    when it can (or there is none)."""
    if not (results / "sensitivity.csv").exists():
        return None
    path = results / SENSITIVITY_FILE
    if not path.exists() and not path.is_symlink():
        return None  # written before sensitivity kept a record (a FIFO is read, and refused)
    record = SensitivityRecord.read(path)
    check_tables(results, record, ["sensitivity.csv"], SENSITIVITY_FILE)
    fingerprints = (record.dataset_sha256, run.dataset_sha256)
    if all(fingerprints) and fingerprints[0] != fingerprints[1]:
        return (
            f"sensitivity.csv and the other tables were computed on different contents of "
            f"{record.rollouts} (changed between the runs); rerun `basis-bench sensitivity "
            f"--out {results}`"
        )
    if record.rollouts != run.rollouts:
        return (
            f"sensitivity.csv was computed on {record.rollouts}, the other tables on "
            f"{run.rollouts}; rerun `basis-bench sensitivity --out {results}`"
        )
    return None
