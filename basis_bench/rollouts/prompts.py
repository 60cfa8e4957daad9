"""Prompt sources: the problems a run asks, and their gold answers.

Every source yields a polars frame in the store's prompts schema (``prompt_id``,
``problem``, ``answer``, optional ``level``/``subject`` and source-specific extras),
with ``prompt_id`` a hash of the problem text so the same problem has the same id in
every dataset. Problems that repeat within a source are kept once (first occurrence).

Sources (the ``--prompts`` argument of ``basis-bench oracle``):

``PATH``                  a local JSONL, JSON or Parquet file; MATH-style rows (``problem``,
                          ``answer`` or ``solution``, ``level``, ``type``/``subject``) or
                          DAPO-Math-17K rows (``prompt`` messages, ``reward_model.ground_truth``)
                          are recognised by their columns
``hf:NAME[@SPLIT]``       a Hugging Face Hub dataset (``org/name``; split ``train`` unless
                          given), from the local Hugging Face cache or downloaded into it
                          (HF_HUB_OFFLINE: the cache only); needs the ``datasets`` extra
``arithmetic[:k=v,...]``  the built-in generated arithmetic family, see :func:`arithmetic_prompts`
``trainer:PATH``          a trainer's own dataset (TRL's ``train_dataset`` saved to disk or as
                          Parquet/JSONL, a verl parquet), each prompt rendered as the trainer
                          renders it: :mod:`basis_bench.rollouts.trainer_prompts`

Layer: above records, answers and trainer_prompts; the PromptSource section loads through it.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.answers import last_boxed
from basis_bench.rollouts.records import read_records
from basis_bench.rollouts.store import conform_prompts
from basis_bench.rollouts.trainer_prompts import is_trainer_source, trainer_prompts
from basis_bench.settings import check_scalar

# DAPO-Math-17K wraps each problem in this instruction; the problem text is what lies between.
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be "
    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def prompt_id(problem: str) -> str:
    """Stable id of a problem: the first 16 hex digits of SHA-256 of its UTF-8 text."""
    return hashlib.sha256(problem.encode("utf-8")).hexdigest()[:16]


def _finish(df: pl.DataFrame, what: str) -> pl.DataFrame:
    """Attach prompt ids, drop repeated problems, validate against the prompts schema."""
    if df.height == 0:
        raise InputError(f"{what}: no prompts")
    blank = df.filter(pl.col("problem").is_null() | (pl.col("problem").str.strip_chars() == ""))
    if blank.height:  # it was sampled on the instruction alone, without a word
        raise InputError(
            f"{what}: {blank.height} prompt(s) with an empty problem (the first with answer "
            f"{blank['answer'][0]!r}); remove them from the source"
        )
    df = df.unique(subset="problem", keep="first", maintain_order=True)
    df = df.with_columns(
        pl.col("problem").map_elements(prompt_id, return_dtype=pl.String).alias("prompt_id")
    )
    front = ["prompt_id", "problem", "answer"]
    return conform_prompts(df.select(front + [c for c in df.columns if c not in front]), what)


# --------------------------------------------------------------------------- rows


def math_prompts(df: pl.DataFrame, what: str = "MATH") -> pl.DataFrame:
    """MATH-style rows -> prompts. ``answer`` is used when present, else the last ``\\boxed{}``
    of ``solution``; ``level`` "Level 3" or 3 -> 3; ``type`` or ``subject`` -> subject.
    Rows without any answer are dropped with a warning.
    """
    if "problem" not in df.columns:
        raise InputError(f"{what}: MATH rows need a 'problem' column; found {df.columns}")
    if "answer" not in df.columns and "solution" not in df.columns:
        raise InputError(
            f"{what}: MATH rows need an 'answer' or 'solution' column; found {df.columns}"
        )
    answer = pl.lit(None, dtype=pl.String)
    if "solution" in df.columns:
        answer = pl.col("solution").cast(pl.String).map_elements(last_boxed, return_dtype=pl.String)
    if "answer" in df.columns:
        answer = pl.coalesce(pl.col("answer").cast(pl.String), answer)
    out = df.with_columns(answer.alias("answer"))
    if "level" in df.columns:
        level = pl.col("level").cast(pl.String).str.extract(r"(\d+)").cast(pl.Int32)
        out = out.with_columns(level.alias("level"))
    subject = next((c for c in ("subject", "type") if c in df.columns), None)
    if subject is not None:
        out = out.with_columns(pl.col(subject).cast(pl.String).alias("subject"))
    keep = [c for c in ("problem", "answer", "level", "subject", "unique_id") if c in out.columns]
    out = out.select(keep).filter(pl.col("problem").is_not_null())
    missing = out.filter(pl.col("answer").is_null() | (pl.col("answer").str.strip_chars() == ""))
    if missing.height:
        warnings.warn(f"{what}: skipped {missing.height} problem(s) with no answer", stacklevel=2)
        out = out.filter(
            pl.col("answer").is_not_null() & (pl.col("answer").str.strip_chars() != "")
        )
    return out


def dapo_prompts(df: pl.DataFrame, what: str = "DAPO-Math-17K") -> pl.DataFrame:
    """DAPO-Math-17K rows -> prompts.

    ``prompt`` is either the original list of chat messages (the last one's content,
    with DAPO's answer-format instruction stripped, is the problem) or a plain string
    (the open-r1 processed release); the answer is ``reward_model.ground_truth``, else
    ``solution``/``answer``.
    """
    if "prompt" not in df.columns:
        raise InputError(f"{what}: DAPO rows need a 'prompt' column; found {df.columns}")
    dtype = df.schema["prompt"]
    if isinstance(dtype, pl.List):
        problem = pl.col("prompt").list.last().struct.field("content")
    else:
        problem = pl.col("prompt").cast(pl.String)
    problem = problem.str.strip_prefix(DAPO_PREFIX).str.strip_suffix(DAPO_SUFFIX).str.strip_chars()
    if "reward_model" in df.columns:
        answer = pl.col("reward_model").struct.field("ground_truth").cast(pl.String)
    elif "solution" in df.columns or "answer" in df.columns:
        answer = pl.col("solution" if "solution" in df.columns else "answer").cast(pl.String)
    else:
        raise InputError(
            f"{what}: DAPO rows need 'reward_model.ground_truth' or 'solution'; found {df.columns}"
        )
    out = df.select(problem.alias("problem"), answer.alias("answer"))
    out = out.with_columns(pl.lit("dapo").alias("subject"))
    return out.filter(pl.col("problem").is_not_null() & pl.col("answer").is_not_null())


def _records_to_prompts(df: pl.DataFrame, what: str) -> pl.DataFrame:
    """Recognise the row format by its columns."""
    if "prompt" in df.columns and "problem" not in df.columns:
        return dapo_prompts(df, what)
    return math_prompts(df, what)


def _hub_records(spec: str) -> pl.DataFrame:
    """Rows of ``NAME[@SPLIT]``, a Hub dataset's snapshot (:mod:`.hub`) read by the optional
    ``datasets`` package (its data files, splits and configs as the Hub shows them)."""
    from basis_bench.rollouts.hub import hub_name_problem, hub_snapshot

    name, _, split = spec.partition("@")
    problem = hub_name_problem(name, org=False)  # hf:../../etc, hf:, hf:/etc went unchecked
    if problem is not None:
        raise InputError(f"--prompts hf:{spec}: not a Hugging Face dataset name ({problem})")
    try:
        import datasets
    except ImportError as err:
        raise InputError(
            f"--prompts hf:{name} needs the 'datasets' package, which is not installed: "
            "pip install 'basis-bench[datasets]', or pass the dataset's local JSONL/Parquet path"
        ) from err
    folder = hub_snapshot(name, "dataset", f"--prompts hf:{name}")
    try:
        ds = datasets.load_dataset(str(folder), split=split or "train")
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise InputError(
            f"--prompts hf:{spec}: could not read the dataset in {folder} "
            f"({type(err).__name__}: {reason}); pass a local JSONL/Parquet path instead"
        ) from err
    return pl.from_arrow(ds.data.table)  # type: ignore[return-value]


# --------------------------------------------------------------------------- arithmetic

ARITHMETIC_OPERATIONS = "+-*"
_ARITHMETIC_BLOCK = 512


def _span(value: int | tuple[int, int], name: str, lo: int, hi: int) -> tuple[int, int]:
    """An int or an inclusive (min, max) pair, checked to lie within [lo, hi]."""
    a, b = (value, value) if isinstance(value, int) else value
    if not (lo <= a <= b <= hi):
        raise InputError(
            f"arithmetic: {name} must be in {lo}..{hi} (a number or min-max), got {value}"
        )
    return a, b


def arithmetic_prompts(
    n: int,
    digits: int | tuple[int, int] = 1,
    steps: int | tuple[int, int] = 1,
    operations: str = "+-",
    seed: int = 0,
) -> pl.DataFrame:
    """``n`` distinct generated arithmetic problems, e.g. "What is 37 + 4 * 12?".

    Difficulty is controlled by operand ``digits``, number of operations ``steps``
    (each an int or an inclusive (min, max) range drawn per problem) and the allowed
    ``operations`` (from "+-*"; usual precedence). Answers are exact integers. With
    one-digit addition SmolLM2-135M is right some of the time, and longer chains and
    more digits push its success rate towards 0, so a range of settings gives prompts
    of graded difficulty. Deterministic in ``seed``, and the first ``n`` problems do
    not depend on ``n`` (asking for more extends the list). Grade the responses with
    ``RewardConfig(answer_format="number")``: math-verify's default extraction would
    credit a response that merely restates "8 + 6".
    """
    check_scalar(n, "arithmetic: n", int, min_val=1)
    d_lo, d_hi = _span(digits, "digits", 1, 9)
    s_lo, s_hi = _span(steps, "steps", 1, 8)
    ops = sorted(set(operations))
    if not ops or any(o not in ARITHMETIC_OPERATIONS for o in ops):
        raise InputError(
            f"arithmetic: operations must be drawn from {ARITHMETIC_OPERATIONS!r}, got {operations!r}"
        )
    rng = np.random.default_rng(seed)
    problems: dict[str, tuple[str, int, int]] = {}
    stalled = 0
    # Candidates come in fixed-size blocks, so the stream (and every prefix) depends only on the seed.
    m = _ARITHMETIC_BLOCK
    while len(problems) < n and stalled < 50:
        row_digits = rng.integers(d_lo, d_hi + 1, size=m)
        row_steps = rng.integers(s_lo, s_hi + 1, size=m)
        low = np.where(row_digits > 1, 10 ** (row_digits - 1), 0)[:, None]
        operands = rng.integers(low, 10 ** row_digits[:, None], size=(m, s_hi + 1))
        chosen = np.asarray(ops)[rng.integers(0, len(ops), size=(m, s_hi))]
        values = _evaluate(operands, chosen, row_steps)
        before = len(problems)
        for i in range(m):
            terms = [str(operands[i, 0])]
            for j in range(row_steps[i]):
                terms += [chosen[i, j], str(operands[i, j + 1])]
            text = f"What is {' '.join(terms)}?"
            if text not in problems and len(problems) < n:
                problems[text] = (str(values[i]), int(row_digits[i]), int(row_steps[i]))
        stalled = stalled + 1 if len(problems) == before else 0
    if len(problems) < n:
        raise InputError(
            f"arithmetic: only {len(problems)} distinct problems exist with digits={digits}, "
            f"steps={steps}, operations={operations!r}; ask for fewer or widen the settings"
        )
    df = pl.DataFrame(
        {
            "problem": list(problems),
            "answer": [v[0] for v in problems.values()],
            "subject": ["arithmetic"] * n,
            "digits": [v[1] for v in problems.values()],
            "steps": [v[2] for v in problems.values()],
        },
        schema_overrides={"digits": pl.Int32, "steps": pl.Int32},
    )
    return _finish(df, "arithmetic")


def _evaluate(operands: np.ndarray, ops: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Values of ``o0 op0 o1 op1 ...`` (first ``steps`` ops per row) with * before + and -.

    Left to right, keeping the finished sum and the current product term: "*" grows the
    term; "+"/"-" banks it and starts a new one. Python ints (object dtype): no overflow.
    """
    total = np.zeros(len(operands), dtype=object)
    term = operands[:, 0].astype(object)
    for j in range(ops.shape[1]):
        active = j < steps
        x = operands[:, j + 1].astype(object)
        mul = active & (ops[:, j] == "*")
        new_term = active & ~mul
        total = np.where(new_term, total + term, total)
        signed = np.where(ops[:, j] == "-", -x, x)
        term = np.where(mul, term * x, np.where(new_term, signed, term))
    return total + term


def parse_arithmetic_spec(spec: str) -> dict[str, Any]:
    """Keyword arguments of :func:`arithmetic_prompts` from ``n=200,digits=1-2,steps=1-3,ops=+-*,seed=0``."""
    kwargs: dict[str, Any] = {"n": 100}
    seen: set[str] = set()
    for item in filter(None, (s.strip() for s in spec.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise InputError(f"arithmetic: expected key=value, got {item!r}")
        name = "operations" if key == "ops" else key
        if name in seen:  # the later value silently won
            raise InputError(f"arithmetic: {key} is given twice in {spec!r}; give it once")
        seen.add(name)
        try:
            if key in ("n", "seed"):
                kwargs[key] = int(value)
            elif key in ("digits", "steps"):
                lo, _, hi = value.partition("-")
                kwargs[key] = (int(lo), int(hi or lo))
            elif key in ("ops", "operations"):
                kwargs["operations"] = value.strip()
            else:
                raise InputError(
                    f"arithmetic: unknown setting {key!r}; use n, digits, steps, ops, seed"
                )
        except ValueError as err:
            if isinstance(err, InputError):
                raise
            raise InputError(f"arithmetic: {key}={value!r} is not a number or range") from err
    return kwargs


# --------------------------------------------------------------------------- dispatch


def parse_levels(text: str) -> list[int]:
    """``"3-5"`` or ``"3,4,5"`` -> [3, 4, 5]."""
    levels: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None or (match[2] is not None and int(match[2]) < int(match[1])):
            raise InputError(f"--levels: expected e.g. '3-5' or '3,4,5', got {text!r}")
        levels.extend(range(int(match[1]), int(match[2] or match[1]) + 1))
    return levels


def load_prompt_source(
    source: str, levels: Sequence[int] | None = None, limit: int | None = None
) -> pl.DataFrame:
    """The prompts of a source spec (see the module docstring), level-filtered, first ``limit``."""
    if source == "arithmetic" or source.startswith("arithmetic:"):
        if levels:
            raise InputError(
                "--levels applies to MATH-style sources; the arithmetic family has none"
            )
        df = arithmetic_prompts(**parse_arithmetic_spec(source.partition(":")[2]))
    else:
        what = source
        if is_trainer_source(source):
            df = _finish(trainer_prompts(source), what)
        elif source.startswith("hf:"):
            df = _finish(_records_to_prompts(_hub_records(source[3:]), what), what)
        else:
            df = _finish(_records_to_prompts(read_records(source), what), what)
        if levels:
            if "level" not in df.columns:
                raise InputError(f"{what}: --levels given but the source has no level column")
            df = df.filter(pl.col("level").is_in(list(levels)))
            if df.height == 0:
                raise InputError(f"{what}: no prompts at levels {sorted(set(levels))}")
    if limit is not None:
        check_scalar(limit, "--limit", int, min_val=1)
        df = df.head(limit)
    return df
