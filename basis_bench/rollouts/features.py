"""Per-prompt feature vectors phi(x), for estimators that condition on the prompt (``basis_context``).

Features are data: ``prompts.parquet`` may hold a ``features`` column (a list of floats per
prompt, one length for all: e.g. the reference model's final hidden state of the prompt).
Where it does not, two featurizers need no model (``auto`` takes plain):

* ``plain``: what a prompt visibly is: the answer is negative, its number of digits, the
  operators of the problem (+, -, *, /), and MATH's ``level`` and ``subject`` (one-hot)
  where the table has them;
* ``text``: hashed word n-grams (n = 1, 2) of the problem text, each token's count added to
  one of ``dim`` buckets with a hash sign (the hashing trick), log-scaled.

:func:`prompt_features` builds one (P, d) matrix for a list of prompt ids.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence

import numpy as np
import polars as pl

from basis_bench.errors import InputError

FEATURE_COLUMN = "features"
FEATURE_KINDS = ("auto", "stored", "plain", "text", "none")
TEXT_DIM = 32
OPERATORS = ("+", "-", "*", "/")
_TOKEN = re.compile(r"\d+|[A-Za-z]+|[^\sA-Za-z\d]")
_OPERATION = re.compile(r"(?<=[\d)])\s*([+\-*/])(?=\s*[\d(])")  # binary: a number each side


def _bucket(token: str, dim: int) -> tuple[int, float]:
    """A stable (process-independent) bucket in [0, dim) and sign for a token."""
    h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")
    return h % dim, 1.0 if (h >> 32) & 1 else -1.0


def text_features(texts: Sequence[str], dim: int = TEXT_DIM) -> np.ndarray:
    """Hashed word unigrams and bigrams (P, dim): sign(c) log1p(|c|) of each bucket's signed count."""
    if dim < 1:
        raise InputError(f"the text featurizer needs dim >= 1; got {dim}")
    out = np.zeros((len(texts), dim))
    for row, text in enumerate(texts):
        tokens = _TOKEN.findall(str(text).lower())
        for gram in [*tokens, *(f"{a} {b}" for a, b in itertools.pairwise(tokens))]:
            col, sign = _bucket(gram, dim)
            out[row, col] += sign
    return np.sign(out) * np.log1p(np.abs(out))


def _number(answer: str) -> float | None:
    try:
        return float(str(answer).strip().replace(",", ""))
    except ValueError:
        return None


def plain_features(prompts: pl.DataFrame) -> tuple[np.ndarray, list[str]]:
    """(P, d) visible properties of each prompt, and their names."""
    cols: dict[str, list[float]] = {}
    if "answer" in prompts.columns:
        numbers = [_number(a) for a in prompts["answer"].to_list()]
        cols["answer_negative"] = [float(x is not None and x < 0) for x in numbers]
        cols["answer_digits"] = [
            float(len(str(int(abs(x))))) if x is not None and np.isfinite(x) else 0.0
            for x in numbers
        ]
    if "problem" in prompts.columns:
        ops = [set(_OPERATION.findall(str(p))) for p in prompts["problem"].to_list()]
        for op in OPERATORS:
            cols[f"op{op}"] = [float(op in o) for o in ops]
    if "level" in prompts.columns:
        cols["level"] = [float(x) if x is not None else 0.0 for x in prompts["level"].to_list()]
    if "subject" in prompts.columns:
        subjects = [str(s) for s in prompts["subject"].to_list()]
        for name in sorted(set(subjects)):
            cols[f"subject={name}"] = [float(s == name) for s in subjects]
    names = list(cols)
    matrix = np.array([cols[n] for n in names]).T if names else np.zeros((prompts.height, 0))
    return matrix.reshape(prompts.height, len(names)), names


def stored_features(prompts: pl.DataFrame) -> np.ndarray:
    """The ``features`` column as (P, d); every row the same length, finite."""
    rows = prompts[FEATURE_COLUMN].to_list()
    lengths = {len(r) if r is not None else 0 for r in rows}
    if len(lengths) != 1 or 0 in lengths:
        raise InputError(
            f"prompts.parquet's {FEATURE_COLUMN!r} column needs one non-empty vector per "
            f"prompt, all of one length; got lengths {sorted(lengths)[:4]}"
        )
    try:
        out = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"prompts.parquet's {FEATURE_COLUMN!r} column must hold numbers") from None
    if not np.all(np.isfinite(out)):
        raise InputError(f"prompts.parquet's {FEATURE_COLUMN!r} column has non-finite values")
    return out


def check_feature_kind(prompts: pl.DataFrame | None, kind: str) -> None:
    """Refuse, before any replay, a kind the prompts table cannot give (``stored``, ``plain``
    or ``text`` without a table: the two latter ran with no features, silently; ``stored``
    without its column, ``text`` without problems, a malformed column)."""
    if kind in ("stored", "plain", "text") and prompts is None:
        raise InputError(
            f"features {kind!r} need the dataset's prompts.parquet; it has none (--features "
            "none or auto runs without features)"
        )
    if prompts is not None:
        prompt_features(prompts, prompts["prompt_id"].to_list(), kind)


def prompt_features(
    prompts: pl.DataFrame | None, prompt_ids: Sequence[str], kind: str = "auto"
) -> np.ndarray | None:
    """Features (P, d) of ``prompt_ids`` in that order, or None (``none``, or no table).

    kind: ``stored`` (the ``features`` column), ``plain``, ``text``, or ``auto``: stored
    when the column exists, else plain. Text is there on request only: on the default data
    its 32 hashed buckets made ``basis_context`` worse than plain (docs/results.md).
    """
    if kind not in FEATURE_KINDS:
        raise InputError(f"unknown prompt feature kind {kind!r}; choose one of {FEATURE_KINDS}")
    if kind == "none" or prompts is None:
        return None
    table = pl.DataFrame({"prompt_id": list(prompt_ids)}).join(
        prompts, on="prompt_id", how="left", maintain_order="left"
    )
    if "problem" in table.columns and table["problem"].null_count():
        missing = table.filter(pl.col("problem").is_null())["prompt_id"]
        raise InputError(
            f"{missing.len()} of the {table.height} prompts (e.g. {missing[0]!r}) are not in "
            "the prompts table (the dataset's prompts.parquet), whose features these "
            "prompts need: add them to it, or run without prompt features (evaluate: "
            "--features none)"
        )
    has_stored = FEATURE_COLUMN in table.columns
    if kind == "stored" or (kind == "auto" and has_stored):
        if not has_stored:
            raise InputError(f"the prompts table has no {FEATURE_COLUMN!r} column")
        return stored_features(table)
    if kind == "text":
        if "problem" not in table.columns:
            raise InputError("the text featurizer needs the prompts table's 'problem' column")
        return text_features(table["problem"].to_list())
    return plain_features(table)[0]
