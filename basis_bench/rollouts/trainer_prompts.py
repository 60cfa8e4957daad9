"""A trainer's own dataset as a prompt source (``--prompts trainer:PATH``), each prompt given to
the model exactly as the trainer gives it.

PATH is what TRL's ``train_dataset`` or verl's ``data.train_files`` holds: a folder written by
``datasets``' ``save_to_disk``, or a Parquet, JSONL or JSON file, whose ``prompt`` column is a
list of chat messages (TRL's conversational format, every verl parquet) or a plain text (TRL's
standard format). A chat is rendered by the model's chat template with the generation prompt,
system message and all, as TRL's ``GRPOTrainer`` and verl's ``RLHFDataset`` render it; a
plain text is given as it is (tokenised with the tokenizer's special tokens, as TRL does).

In the prompts table, ``problem`` is the text the plug-ins key a prompt by (a chat's last user
message: :func:`prompt_text`), ``trainer_prompt`` the prompt as the
dataset holds it (JSON) and ``trainer_row`` the row's other columns (JSON), which a reward
function gets as keyword arguments, as TRL passes them. The gold answer (for math-verify) is
verl's ``reward_model.ground_truth``, else ``answer``, else the last ``\\boxed{}`` of (or the
whole) ``solution``, else ``ground_truth``; none of them: empty, and ``--reward`` must score.

Layer: above records and answers; it owns ``trainer:`` and knows no settings section.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from basis_bench.errors import InputError
from basis_bench.rollouts.answers import last_boxed
from basis_bench.rollouts.records import read_records

PREFIX = "trainer:"
"""The prompt source spec of a trainer's dataset: ``trainer:PATH``."""
PROMPT_COLUMN = "trainer_prompt"
ROW_COLUMN = "trainer_row"
ANSWER_SOURCES = ("reward_model.ground_truth", "answer", "solution", "ground_truth")


def is_trainer_source(source: str) -> bool:
    return source.startswith(PREFIX)


@dataclass(frozen=True)
class TrainerPrompt:
    """One prompt as a trainer's dataset holds it, kept as canonical JSON text."""

    json: str

    @classmethod
    def of(cls, value: Any) -> TrainerPrompt:
        return cls(json.dumps(value, sort_keys=True, ensure_ascii=False))

    @property
    def value(self) -> Any:
        """A list of {"role", "content"} messages, or a plain text."""
        return json.loads(self.json)

    @property
    def is_chat(self) -> bool:
        return not isinstance(self.value, str)

    def render(self, tokenizer: Any) -> tuple[str, bool]:
        """(the text the trainer gives the model, whether the tokenizer adds its special
        tokens to it): a chat through the chat template (which writes its own), a plain text
        as it is."""
        value = self.value
        if isinstance(value, str):
            return value, True
        if getattr(tokenizer, "chat_template", None) is None:
            raise InputError(
                "the dataset's prompts are chat messages but the model's tokenizer has no chat "
                "template (the trainer could not render them either)"
            )
        text = tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=True)
        return str(text), False

    def shown(self) -> str:
        """The prompt for a reader: a plain text, or one ``[role] content`` line per message."""
        value = self.value
        if isinstance(value, str):
            return value
        return "\n".join(f"[{m.get('role')}] {m.get('content')}" for m in value)


def model_inputs(prompts: pl.DataFrame) -> list[Any]:
    """What the sampler renders for each prompt: its :class:`TrainerPrompt` where the table
    holds one, else the problem (rendered with the run's template)."""
    if PROMPT_COLUMN not in prompts.columns:
        return prompts["problem"].to_list()
    return [
        problem if raw is None else TrainerPrompt(raw)
        for problem, raw in zip(prompts["problem"], prompts[PROMPT_COLUMN], strict=True)
    ]


def reward_columns(prompts: pl.DataFrame) -> list[dict[str, Any]]:
    """Each prompt's keyword arguments for a reward function: its trainer row's columns, or
    (a prompt of another source) its prompts-table columns."""
    rows = []
    for row in prompts.iter_rows(named=True):
        raw = row.get(ROW_COLUMN)
        if raw is not None:
            rows.append(json.loads(raw))
        else:
            rows.append(
                {k: v for k, v in row.items() if k not in ("prompt_id", "features", PROMPT_COLUMN)}
            )
    return rows


def _read(path: Path, what: str) -> pl.DataFrame:
    """Rows of a ``save_to_disk`` folder (needs ``datasets``) or a Parquet/JSONL/JSON file."""
    if not path.is_dir():
        return read_records(path)
    try:
        import datasets
    except ImportError as err:
        raise InputError(
            f"{what}: reading a datasets folder needs the 'datasets' package: pip install "
            "'basis-bench[datasets]', or save the dataset as Parquet (dataset.to_parquet(...))"
        ) from err
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise InputError(f"{what}: not a datasets folder ({type(err).__name__}: {reason})") from err
    if isinstance(ds, datasets.DatasetDict):
        if "train" not in ds:
            raise InputError(f"{what}: a DatasetDict without a 'train' split ({list(ds)})")
        ds = ds["train"]
    frame = pl.from_arrow(ds.flatten_indices().data.table)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _answer(row: Mapping[str, Any]) -> str:
    """The gold answer of a row (see the module docstring), or ""."""
    reward_model = row.get("reward_model")
    if isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None:
        return str(reward_model["ground_truth"])
    for name in ("answer", "solution", "ground_truth"):
        value = row.get(name)
        if value is None or not str(value).strip():
            continue
        text = str(value)
        return (last_boxed(text) or text) if name == "solution" else text
    return ""


def prompt_text(prompt: Any) -> str:
    """The text a prompt is keyed by: a plain string, or a chat's last user message.

    Chat prompts are sequences of {"role", "content"} messages (lists or numpy object
    arrays, as verl and TRL pass them); content given as parts keeps its text parts.
    """
    if isinstance(prompt, str):
        return prompt.strip()
    messages = list(prompt) if isinstance(prompt, Sequence | np.ndarray) else None
    if not messages or not all(isinstance(m, Mapping) for m in messages):
        raise InputError(
            f"a prompt must be a string or a list of chat messages; got {type(prompt).__name__}"
        )
    users = [m for m in messages if m.get("role") == "user"]
    content = (users or messages)[-1].get("content", "")
    if not isinstance(content, str | Sequence) or not all(
        isinstance(p, Mapping) for p in (() if isinstance(content, str) else content)
    ):  # None: every such prompt would share the key of ""
        raise InputError(
            f"a chat message's content must be text or a list of parts; got {content!r:.80}"
        )
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content.strip()


def prompt_key(prompt: Any) -> str:
    """Stable content key of a prompt: sha256 of :func:`prompt_text` (first 32 hex digits)."""
    text = prompt_text(prompt)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(
            f"a prompt holds a lone surrogate ({text[err.start]!r} at {err.start}), not text: "
            "decode the prompts as UTF-8 before keying them"
        ) from err
    return hashlib.sha256(data).hexdigest()[:32]


def trainer_prompts(spec: str) -> pl.DataFrame:
    """The prompts of ``trainer:PATH`` (``problem``, ``answer``, ``trainer_prompt``,
    ``trainer_row``), before ids are attached."""
    what = spec
    path = Path(spec[len(PREFIX) :])
    if not path.exists():
        raise InputError(f"--prompts {spec}: {path} does not exist")
    df = _read(path, what)
    if "prompt" not in df.columns:
        raise InputError(
            f"{what}: a trainer's dataset needs a 'prompt' column (chat messages or text); "
            f"found {df.columns}"
        )
    rows: dict[str, list[Any]] = {"problem": [], "answer": [], PROMPT_COLUMN: [], ROW_COLUMN: []}
    seen: dict[str, str] = {}
    for i, row in enumerate(df.iter_rows(named=True)):
        prompt = TrainerPrompt.of(row["prompt"])
        try:
            key = prompt_text(row["prompt"])
        except InputError as err:
            raise InputError(f"{what}: row {i}: {err}") from None
        if seen.setdefault(key, prompt.json) != prompt.json:
            raise InputError(
                f"{what}: row {i} has the user message of an earlier row under other messages "
                f"({key[:60]!r}); the plug-ins key prompts by that message, so make it unique"
            )
        rows["problem"].append(key)
        rows["answer"].append(_answer(row))
        rows[PROMPT_COLUMN].append(prompt.json)
        others = {k: v for k, v in row.items() if k != "prompt"}
        rows[ROW_COLUMN].append(json.dumps(others, sort_keys=True, default=str))
    return pl.DataFrame(rows, schema={k: pl.String for k in rows})


def shown_prompts(prompts: Sequence[Any]) -> list[str]:
    """:meth:`TrainerPrompt.shown` of raw prompts (chat messages or texts)."""
    return [TrainerPrompt.of(p).shown() for p in prompts]
