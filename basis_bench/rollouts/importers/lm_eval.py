"""``lm-eval``: lm-evaluation-harness's ``--log_samples`` files, ``samples_<task>_<date>.jsonl``.

lm-eval writes one line per document and filter: ``doc_id``, ``doc`` (the dataset row),
``target``, ``arguments``, ``resps`` (per request, the model's raw outputs: ``repeats`` of
them), ``filtered_resps``, ``filter``, ``metrics`` (the names of the metrics on the line),
the hashes, and each metric's value (``"exact_match": 1.0``, ``"acc": 0``). The import keeps
the lines of one filter (``--filter``; needed when the files hold several, e.g. gsm8k's
``strict-match`` and ``flexible-extract``) and reads one metric (``--metric``; needed when
the lines name several):

- a number (or boolean) is one sample of the document, its response the first raw output;
  under a filter that reduces the repeats (``maj@k``) that number scores the vote, so the
  per-response filters (``take_first``, lm-eval's default) are the ones to import;
- a list of numbers is one sample per element (a task whose ``process_results`` scores
  each of its repeats), with the raw outputs as responses when there are as many.

Several files of one task (one run per seed) are more samples of each document, appended in
file order, as ``eval-jsonl`` does; within one file a document is on one line per filter.
Prompt ids are the ``doc_id`` (``--id-format`` as elsewhere); the problem is the document's
``--problem-col`` (default: the first of problem, question, Problem, Question the docs of its
file have) and the answer its ``--answer-col``, else lm-eval's ``target``: text or an integer (its digits);
anything else there (a float, null, a list) is refused at its line, as is an empty problem.
A GSM8K-style full solution (gsm8k's target is the whole ``answer`` field, ending in
``#### 42``) is stored as its final answer, ``42``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.importers.checks import (
    add_prompt_ids,
    one_problem_per_id,
    prompts_from,
    report_duplicates,
)
from basis_bench.rollouts.importers.options import ImportOptions
from basis_bench.rollouts.importers.reading import (
    FILE_INDEX,
    LOC,
    Imported,
    Problems,
    Source,
    check_exists,
    describe_source,
    diagnose_jsonl,
    finite_number,
    kind_column,
    nonblank_lines,
    python_id_kind,
    sources_label,
    stack_sources,
)

LOGGED_FIELDS = frozenset(
    {"doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter", "metrics"}
    | {"doc_hash", "prompt_hash", "target_hash"}
)
"""What lm-eval writes on every line besides the metrics' values."""
PROBLEM_FIELDS = ("problem", "question", "Problem", "Question")
NO_FILTER = "none"  # lm-eval's name for a task without filters (its default take_first)

Line = tuple[int, dict[str, Any]]  # (line number, the parsed line)


def _parse(path: Path, problems: Problems) -> list[Line]:
    check_exists(path)
    data, numbers = nonblank_lines(path)
    if not numbers.size:
        raise InputError(f"{path}: the file is empty")
    rows = diagnose_jsonl(path, numbers, data, problems)
    return [(n, row) for n, row in zip(numbers.tolist(), rows, strict=True) if row is not None]


def _filter(row: dict[str, Any]) -> str:
    return str(row.get("filter", NO_FILTER))


def _choose(given: str | None, found: Sequence[str], what: str, flag: str, files: str) -> str:
    """The filter or metric to read: the one named (it must occur), else the only one."""
    held = (
        f"{what}s {', '.join(found)}"
        if found
        else f"no {what} (a field lm-eval writes on every line is none)"
    )
    if given is not None:
        if given not in found:
            raise InputError(f"{flag} {given!r}: the lines of {files} hold {held}")
        return given
    if not found:  # "hold metrics none; pick one with --metric" offered nothing to pick
        raise InputError(f"{files}: the lines hold {held}")
    if len(found) != 1:
        raise InputError(f"{files}: the lines hold {held}; pick one with {flag}")
    return found[0]


def _metric_names(lines: Sequence[Line]) -> list[str]:
    """The metrics the lines name (their ``metrics`` lists; lines without one: every
    field that is not one lm-eval always writes)."""
    names: dict[str, None] = {}
    for _, row in lines:
        listed = row.get("metrics")
        keys = listed if isinstance(listed, list) else list(row)
        # a field lm-eval always writes is never a metric: "metrics": ["doc_id"] made the
        # doc ids rewards
        names.update(
            dict.fromkeys(k for k in keys if isinstance(k, str) and k not in LOGGED_FIELDS)
        )
    return list(names)


def _scores(value: Any) -> list[float] | None:
    """A metric's value as the line's samples: a number is one, a list one per element."""
    values = value if isinstance(value, list) and value else [value]
    if not all(isinstance(v, bool | int | float) and finite_number(v) for v in values):
        return None
    return [float(v) for v in values]


def _outputs(resps: Any) -> list[str] | None:
    """The raw outputs of a line with one text request (generate_until), else None."""
    if isinstance(resps, list) and len(resps) == 1 and isinstance(resps[0], list):
        if resps[0] and all(isinstance(r, str) for r in resps[0]):
            return list(resps[0])
    return None


def _text(value: Any) -> str | None:
    """Text as it is, an integer as its digits; anything else is no text."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else None


FINAL_ANSWER = re.compile(r"####\s*([^\n]*?)\s*$")
"""GSM8K's full-solution answer ends in ``#### 42``: the final answer follows the marks."""


def _final_answer(text: str | None) -> str | None:
    """The final answer of a GSM8K-style full solution (what follows its last ``####``, a
    task's ``target`` when it is ``{{answer}}``), else ``text`` as it is."""
    found = FINAL_ANSWER.search(text) if text is not None else None
    return found.group(1) if found is not None and found.group(1) else text


def _line_record(
    line: Line,
    src: Source,
    metric: str,
    fields: tuple[str, str | None, str | None],
    problems: Problems,
) -> dict[str, Any]:
    """One line as a row of the import's table (scores and responses as lists); ``fields``
    are the id's, the problem's and the answer's."""
    (lineno, row), where = line, src.where(line[0])
    id_col, problem_col, answer_col = fields
    scores = _scores(row.get(metric))
    if scores is None:
        problems.add(
            where,
            f"{metric!r} is {json.dumps(row.get(metric))[:60]}, not a number or a list of numbers",
        )
    outputs = _outputs(row.get("resps"))
    if scores is not None and outputs is not None and len(scores) > 1:
        if len(outputs) != len(scores):
            problems.add(where, f"{len(scores)} {metric!r} values but {len(outputs)} responses")
        responses: list[str] | None = outputs
    else:
        responses = outputs[:1] if outputs is not None and scores is not None else None
    doc: dict[str, Any] = row["doc"] if isinstance(row.get("doc"), dict) else {}
    answer = doc.get(answer_col) if answer_col is not None else row.get("target")
    problem = doc.get(problem_col) if problem_col is not None else None
    if problem is not None and _text(problem) is None:
        problems.add(where, f"doc's {problem_col!r} is {json.dumps(problem)[:60]}, not text")
    elif problem is not None and not str(problem).strip():  # sampled on the instruction alone
        problems.add(where, f"doc's {problem_col!r} is empty")
    if _text(answer) is None:  # a float, null or list target was stored as the answer ''
        field = f"doc's {answer_col!r}" if answer_col is not None else "'target'"
        problems.add(
            where, f"{field} is {json.dumps(answer)[:60]}, not text or an integer (the answer)"
        )
    ident = row.get(id_col)
    return {
        "doc_id": ident if isinstance(ident, str) or ident is None else json.dumps(ident),
        kind_column("doc_id"): python_id_kind(ident),
        "scores": scores,
        "responses": responses,
        "problem": _text(problem),
        "answer": _final_answer(_text(answer)),
        LOC: lineno,
    }


def _docs(lines: Sequence[Line]) -> list[dict[str, Any]]:
    return [row["doc"] for _, row in lines if isinstance(row.get("doc"), dict)]


def _check_named_fields(lines: Sequence[Line], opt: ImportOptions, files: str) -> None:
    """A document field the user names (``--problem-col``, ``--answer-col``) must be in some
    document, or a misspelt name would go unused."""
    docs = _docs(lines)
    for flag, name in (("--problem-col", opt.problem_col), ("--answer-col", opt.answer_col)):
        if name is not None and not any(name in d for d in docs):
            raise InputError(f"{flag} {name!r}: no doc in {files} has that field")


def _doc_fields(lines: Sequence[Line], opt: ImportOptions) -> tuple[str, str | None, str | None]:
    """One file's line id field (``--id-col``, default doc_id) and the document fields of
    the problem and the answer: those named, else the first of :data:`PROBLEM_FIELDS` a
    document of this file has (per file: gsm8k's docs say question, MATH's problem, and one
    choice for both stored gsm8k's problems as empty text), and no answer field (lm-eval's
    target)."""
    problem = opt.problem_col or next(
        (f for f in PROBLEM_FIELDS if any(f in d for d in _docs(lines))), None
    )
    return opt.id_col or "doc_id", problem, opt.answer_col


def import_lm_eval(paths: Sequence[Path], policy: str, opt: ImportOptions) -> Imported:
    problems = Problems()
    files = sources_label(paths)
    parsed = [_parse(path, problems) for path in paths]
    problems.raise_if_any(files)
    filters = list(dict.fromkeys(_filter(row) for lines in parsed for _, row in lines))
    chosen = _choose(opt.filter_name, filters, "filter", "--filter", files)
    parsed = [[line for line in lines if _filter(line[1]) == chosen] for lines in parsed]
    kept = [line for lines in parsed for line in lines]
    metric = _choose(opt.metric, _metric_names(kept), "metric", "--metric", files)
    _check_named_fields(kept, opt, files)
    frames, sources, problem_fields = [], [], []
    for path, lines in zip(paths, parsed, strict=True):
        src = Source(path, "line")
        fields = _doc_fields(lines, opt)
        problem_fields.append(fields[1])
        rows = [_line_record(line, src, metric, fields, problems) for line in lines]
        frame = pl.DataFrame(
            rows,
            schema={
                "doc_id": pl.String(),
                kind_column("doc_id"): pl.String(),
                "scores": pl.List(pl.Float64),
                "responses": pl.List(pl.String),
                "problem": pl.String(),
                "answer": pl.String(),
                LOC: pl.Int64(),
            },
        )
        frames.append(add_prompt_ids(frame, src, "doc_id", opt.id_format, problems))
        sources.append(src)
    table = stack_sources(frames)
    report_duplicates(table, sources, ["prompt_id", FILE_INDEX], problems, "doc_id in one file")
    problems.raise_if_any(files)
    one_problem_per_id(table, ("doc_id", "problem", "answer"), sources)  # not by doc id alone
    return Imported(
        "lm-eval",
        _samples(table.sort(FILE_INDEX, LOC), policy),
        [policy],
        prompts_from(table, "problem", "answer") if table["problem"].is_not_null().any() else None,
        [describe_source(s.path, f.height) for s, f in zip(sources, frames, strict=True)],
        "source",
        {
            "filter": chosen,
            "metric": metric,
            "fields": {
                "id": opt.id_col or "doc_id",
                "problem": ", ".join(dict.fromkeys(f for f in problem_fields if f)) or None,
            },
        },
    )


def _samples(table: pl.DataFrame, policy: str) -> pl.DataFrame:
    """One row per sample: each line's scores in order, files appended in the order given."""
    has_responses = table["responses"].is_not_null().any()
    responses = pl.col("responses").fill_null(pl.col("scores").list.eval(pl.lit(None, pl.String)))
    return (
        table.select(
            "prompt_id",
            pl.col("scores").alias("reward"),
            *([responses.alias("response")] if has_responses else []),
        )
        .explode(["reward", *(["response"] if has_responses else [])])
        .with_columns(
            pl.int_range(pl.len()).over("prompt_id").cast(pl.Int32).alias("sample_idx"),
            pl.lit(policy).alias("policy"),
        )
        .select(
            "prompt_id", "policy", "sample_idx", "reward", *(["response"] if has_responses else [])
        )
    )
