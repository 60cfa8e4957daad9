""":func:`write_import` publishes an import as oracle does (``DIR/rollouts/<policy>/
part-000000.parquet``, metadata under ``basis_bench``, ``DIR/prompts.parquet`` merged):
every part is first written completely under a staged non-Parquet name, and only when all of
them are written are they renamed into place, so an interrupted import leaves no ``.parquet``
file of its own behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.guards.folders import inside_claim
from basis_bench.guards.locks import publishing
from basis_bench.guards.outputs import (
    REPLACED_SUFFIX,
    claim_output_dir,
    holds_output_locks,
    read_metadata,
    write_parquet_atomic,
)
from basis_bench.guards.provenance import __version__, provenance
from basis_bench.rollouts.importers.reading import Imported
from basis_bench.rollouts.store import (
    file_policies,
    merged_prompts,
    part_path,
    rollout_files,
    write_prompts_table,
)
from basis_bench.rollouts.training_record import STEPS_KEY
from basis_bench.schema import PROMPTS_FILE


def existing_policies(out: Path) -> dict[str, list[Path]]:
    """Policy -> the rollouts files under ``out`` that hold it."""
    held: dict[str, list[Path]] = {}
    if not out.is_dir():
        return held
    for f in rollout_files(out):
        for p in file_policies(f):
            held.setdefault(p, []).append(f)
    return held


def _check_one_reference(out: Path, policy: str, to_remove: Sequence[Path]) -> None:
    """``--reference`` may not name a second reference policy beside the dataset's own
    (files that disagree make every later evaluate ask which one is meant)."""
    for f in rollout_files(out):
        named = read_metadata(f).get("reference_policy") if f not in to_remove else None
        if named is not None and named != policy:
            raise InputError(
                f"{out} already names {named!r} as its reference policy ({f.relative_to(out)}); import "
                f"{policy!r} without --reference, or into another dataset"
            )


@dataclass
class WriteReport:
    files: list[Path]
    replaced: list[str]
    prompts_written: bool


def _files_to_replace(
    out: Path, policies: Sequence[str], replace: bool
) -> tuple[list[str], list[Path]]:
    """The policies of ``policies`` that ``out`` already holds, and their files to remove;
    refused without ``replace``, and for a file shared with other policies."""
    held = existing_policies(out)
    clash = [p for p in policies if p in held]
    if clash and not replace:
        raise InputError(
            f"{out} already holds policy {', '.join(map(repr, clash))}; "
            "pass --replace to overwrite it, or choose another --policy"
        )
    to_remove: list[Path] = []
    for p in clash:
        for f in held[p]:
            others = [q for q in file_policies(f) if q not in policies]
            if others:
                raise InputError(
                    f"{f} holds policy {p!r} together with {', '.join(map(repr, others))}; "
                    "--replace only removes files of the replaced policies alone: remove it by hand"
                )
            to_remove.append(inside_claim(f))
    return clash, to_remove


def _import_metadata(
    result: Imported, label: str | None, reference: bool, step: int | None
) -> dict[str, Any]:
    """The ``basis_bench`` metadata every part of an import carries (with ``step``, the one
    policy's training step: ``training_steps``)."""
    base: dict[str, Any] = {
        "kind": "import",
        "format": result.format,
        "simulated": False,
        "order": result.order,
        "policies": list(result.policies),
        "sources": result.sources,
        "package_version": __version__,
        "provenance": provenance(),
        **result.details,
    }
    if result.order == "synthetic":
        base["order_note"] = (
            "rewards expanded from counts: within a (prompt, policy) group the order is a seeded "
            "random permutation, not the generation order; samples are exchangeable given the "
            "prompt, so subsampling benchmarks are statistically faithful"
        )
    if label is not None:
        base["label"] = label
    if reference:
        if len(result.policies) != 1:
            raise InputError("--reference marks one policy; this import writes several")
        base["reference_policy"] = result.policies[0]
    if step is not None:
        if len(result.policies) != 1:
            raise InputError(
                "--step records one policy's training step; this import writes several"
            )
        base[STEPS_KEY] = {result.policies[0]: step}
    return base


def _publish(
    result: Imported,
    out: Path,
    base: dict[str, Any],
    table: pl.DataFrame | None,
    to_remove: list[Path],
) -> list[Path]:
    """Stage every part, then, under the dataset's publish lock, set the replaced files
    aside and rename the new ones into place: all or nothing. Any error or interruption
    puts the old files and the old prompts table back and leaves no staged file, nor a
    policy folder it made (an empty ``rollouts/POLICY`` was left)."""
    out.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    staged: list[tuple[Path, Path]] = []
    aside: list[tuple[Path, Path]] = []
    published: list[Path] = []
    folders = [part_path(out, name, 0).parent for name in result.policies]
    made = [f for f in (folders[0].parent, *folders) if not f.exists()] if folders else []
    try:
        for name, rows in _policy_rows(result.rollouts):
            final = part_path(out, name, 0)
            stage = final.parent / f".{final.name}.{tag}.staged"
            rows = _in_store_order(rows)
            write_parquet_atomic(rows, stage, {**base, "policy": name})
            staged.append((stage, final))
        with publishing(out):
            prompts = out / PROMPTS_FILE
            if table is not None and prompts.exists():
                aside.append((prompts, _set_aside(prompts, tag, copy=True)))
            if table is not None:
                write_prompts_table(table, out, base)
            for f in to_remove:
                aside.append((f, _set_aside(f, tag)))
            for stage, final in staged:
                os.replace(stage, final)
                published.append(final)
    except BaseException:
        for path in published:
            path.unlink(missing_ok=True)
        for original, kept in reversed(aside):
            os.replace(kept, original)
        for folder in reversed(made):
            with contextlib.suppress(OSError):  # not empty: another writer's since
                folder.rmdir()
        raise
    finally:
        for stage, _ in staged:
            stage.unlink(missing_ok=True)
    for _, kept in aside:
        kept.unlink(missing_ok=True)
    return published


def _in_store_order(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` sorted by (prompt_id, sample_idx); rows already in that order (counts expand
    so, and many sources list each prompt's samples together) are kept, not copied."""
    prompt, sample = pl.col("prompt_id"), pl.col("sample_idx")
    later = (prompt > prompt.shift(1)) | ((prompt == prompt.shift(1)) & (sample > sample.shift(1)))
    if rows.select(later.fill_null(True).all()).item():
        return rows
    return rows.sort("prompt_id", "sample_idx")


def _policy_rows(rollouts: pl.DataFrame) -> Iterator[tuple[str, pl.DataFrame]]:
    """Each policy's rows, in order of first appearance (one policy: the frame itself, not
    a copy)."""
    if rollouts["policy"].n_unique() == 1:
        yield str(rollouts["policy"][0]), rollouts
        return
    for (name,), rows in rollouts.group_by("policy", maintain_order=True):
        yield str(name), rows


def _set_aside(path: Path, tag: str, copy: bool = False) -> Path:
    """Move (or copy, for a file rewritten in place) ``path`` to a hidden name that no
    reader takes for rollouts, to be put back if the publish fails."""
    kept = path.parent / f".{path.name}.{tag}{REPLACED_SUFFIX}"
    if copy:
        shutil.copy2(path, kept)
    else:
        os.replace(path, kept)
    return kept


@holds_output_locks
def write_import(
    result: Imported,
    out: str | os.PathLike[str],
    *,
    replace: bool = False,
    reference: bool = False,
    label: str | None = None,
    prompts: pl.DataFrame | None = None,
    force: bool = False,
    step: int | None = None,
) -> WriteReport:
    """Publish ``result`` into the dataset ``out`` (created), policy by policy; ``step``: the
    one policy's training step, recorded in its parts' metadata.

    An ``out`` that already holds one of the policies is refused unless ``replace``; with
    ``replace`` the old files of those policies are removed (a file that also holds other
    policies is refused, never rewritten). Parts are staged under non-Parquet names and
    renamed into place only after all of them are complete. ``out`` must be new, empty or
    a dataset of real rollouts (:func:`~basis_bench.rollouts.store.claim_output_dir`;
    ``force`` writes anyway).
    """
    out = claim_output_dir(out, "rollouts", simulated=False, force=force)
    clash, to_remove = _files_to_replace(out, result.policies, replace)
    table = prompts if prompts is not None else result.prompts
    if prompts is not None and result.prompts is not None:  # sources' texts fill the gaps
        table = pl.concat(
            [
                prompts,
                result.prompts.filter(~pl.col("prompt_id").is_in(prompts["prompt_id"].implode())),
            ],
            how="diagonal_relaxed",
        )
    if table is not None:  # a held id with another problem or answer: before any write
        merged_prompts(table, out)
    base = _import_metadata(result, label, reference, step)
    if reference:
        _check_one_reference(out, result.policies[0], to_remove)
    published = _publish(result, out, base, table, to_remove)
    return WriteReport(published, clash, table is not None)
