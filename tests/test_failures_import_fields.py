"""``basis-bench import``'s checks of fields, columns and value types (issues 14 and 22):
a boolean where a count belongs, a field named twice, a value that is not text, a column
the store would change. Each refusal is one line naming the file and line, and changes no
byte of the dataset.
"""

from __future__ import annotations

import json

import polars as pl
import pytest
from conftest import import_into, refused_import, run_main, snapshot

from basis_bench.rollouts.store import load_rollouts

# --------------------------------------------------------------------------- import


BOOLEAN_COUNTS = {  # a boolean where an integer count belongs, in every reader
    "first line": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":true}\n{"prompt_id":"b","n":4,"n_correct":2}\n',
        ":1: 'n_correct' true is not an integer",
    ),
    "later line": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":2}\n{"prompt_id":"b","n":4,"n_correct":true}\n',
        ":2: 'n_correct' true is not an integer",
    ),
    "every line": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":true}\n{"prompt_id":"b","n":4,"n_correct":false}\n',
        ":2: 'n_correct' is a boolean, expected an integer",
    ),
    "n": (
        "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":1}\n{"prompt_id":"b","n":true,"n_correct":1}\n',
        ":2: 'n' true is not an integer",
    ),
    "csv": ("c.csv", "prompt_id,n,n_correct\na,4,1\nb,4,true\n", ":3: 'n_correct' true is not"),
}


@pytest.mark.parametrize("case", sorted(BOOLEAN_COUNTS))
def test_import_refuses_a_boolean_among_integer_counts(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    name, text, needle = BOOLEAN_COUNTS[case]
    source = tmp_path / name
    source.write_text(text)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, "counts", source)
    assert code == 2 and f"{source}{needle}" in message, message


def test_import_refuses_booleans_in_a_parquet_count_and_a_long_jsonl(
    monkeypatch, capsys, real_dataset, tmp_path
):
    before = snapshot(real_dataset)
    parquet = tmp_path / "c.parquet"
    pl.DataFrame({"prompt_id": ["a"], "n": [4], "n_correct": [True]}).write_parquet(parquet)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", parquet)
    assert code == 2 and f"{parquet}: row 1: 'n_correct' is a boolean" in message, message
    long = tmp_path / "l.jsonl"
    long.write_text(
        '{"prompt_id":"a","sample_idx":0,"reward":1}\n'
        '{"prompt_id":"a","sample_idx":true,"reward":0.5}\n'
        '{"prompt_id":"b","sample_idx":0,"reward":true}\n'
    )
    code, message = run_main(
        monkeypatch, capsys, "import", "long", str(long), "--policy", "new",
        "--out", str(real_dataset),
    )[:2]  # fmt: skip
    assert code == 2 and f"{long}:3: 'reward' true is not a finite number" in message, message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_long_import_refuses_a_reward_column_of_booleans(
    monkeypatch, capsys, real_dataset, tmp_path, suffix
):
    """Every reward a boolean was once read as 1.0/0.0 (only a boolean among numbers was
    refused): a reward is a number in every format, as in CSV."""
    rows = pl.DataFrame({"prompt_id": ["a", "b"], "sample_idx": [0, 0], "reward": [True, False]})
    source = tmp_path / f"l{suffix}"
    if suffix == ".parquet":
        rows.write_parquet(source)
    else:
        rows.write_ndjson(source)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, "long", source)
    where = f"{source}: row 2" if suffix == ".parquet" else f"{source}:2"
    assert code == 2 and f"{where}: 'reward' false is not a finite number" in message, message


@pytest.mark.parametrize(
    "fmt, text, needle",
    [
        ("long", "prompt_id,sample_idx,reward\na,0,1\na,3000000000,0\n",
         ":3: 'sample_idx' 3000000000 is above 2147483647"),
        ("counts", "prompt_id,n,n_correct\na,4,1\nb,1000000000000,2\n",
         ":3: 'n' 1000000000000 is above 2147483647"),
        ("counts", "prompt_id,n,n_correct\na,-1e30,1\n", ":2: 'n' -1e30 is below 1"),
    ],
)  # fmt: skip
def test_import_refuses_integers_the_store_cannot_hold(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, text, needle
):
    """A sample index is Int32: larger ones (or counts that would make them) are refused by
    line, not a polars overflow or a 7 TiB allocation."""
    source = tmp_path / "s.csv"
    source.write_text(text)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}{needle}" in message, message


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


REPEATED_FIELDS = {  # (format, text whose line 2 names a field twice, the field)
    "eval-jsonl score": (
        "eval-jsonl",
        '{"idx":0,"score":[1]}\n{"idx":1,"score":[true],"score":[false]}\n',
        "score",
    ),
    "eval-jsonl gold answer": (
        "eval-jsonl", '{"idx":0,"score":[1]}\n{"idx":1,"gt":"4","score":[1],"gt":"5"}\n', "gt"
    ),
    "eval-jsonl escaped name": (
        "eval-jsonl", '{"idx":0,"score":[1]}\n{"idx":1,"score":[1],"sc\\u006fre":[0]}\n', "score"
    ),
    "eval-jsonl odd id": (
        "eval-jsonl", '{"idx":0,"score":[1]}\n{"idx":true,"score":[1],"score":[0]}\n', "score"
    ),
    "counts n": (
        "counts",
        '{"prompt_id":"a","n":4,"n_correct":1}\n{"prompt_id":"b","n":4,"n_correct":1,"n":8}\n',
        "n",
    ),
    "long reward": (
        "long",
        '{"prompt_id":"a","sample_idx":0,"reward":1}\n'
        '{"prompt_id":"b","sample_idx":0,"reward":1,"reward":0}\n',
        "reward",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REPEATED_FIELDS))
def test_import_refuses_a_field_named_twice_in_one_json_line(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """polars' reader kept the first of two equal keys (Python's json keeps the last): one
    of the line's values was silently dropped."""
    fmt, text, name = REPEATED_FIELDS[case]
    source = tmp_path / "s.jsonl"
    source.write_text(text)
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}:2: field {name!r} appears twice in the line" in message
    assert snapshot(real_dataset) == before


NOT_TEXT = {  # eval-jsonl line 2 holds a value polars made text, and what the error says
    "float answer": ("gt", 0.1 + 0.2, "'gt' is 0.30000000000000004, not text"),
    "boolean answer": ("gt", True, "'gt' is true, not text or an integer"),
    "float question": ("question", 7.5, "'question' is 7.5, not text"),
    "list answer": ("gt", ["5"], "'gt' is [\"5\"], not text"),
    "number response": ("code", ["a", 3], "'code' holds 3, not text"),
    "boolean response": ("code", [False, "b"], "'code' holds false, not text"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NOT_TEXT))
def test_eval_jsonl_refuses_texts_that_are_not_text(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """polars read a JSON 0.30000000000000004, true or 3 in a text field as the text it
    makes of it: a gold answer or response the evaluator never wrote."""
    name, value, needle = NOT_TEXT[case]
    fields = {"question": "q", "gt": "1", "code": ["a", "b"], "score": [1, 0]}
    lines = [{"idx": 0, **fields}, {"idx": 1, **fields, name: value}]
    source = tmp_path / "e.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)
    assert code == 2 and f"{source}:2: {needle}" in message, message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize("name", ["c.jsonl", "c.parquet"])
def test_counts_refuses_a_problem_or_answer_that_is_not_text(
    monkeypatch, capsys, real_dataset, tmp_path, name
):
    """The prompts of a counts import were cast to text: 0.1 + 0.2 became the answer
    "0.30000000000000004", true the answer "true". An integer answer stays its digits."""
    rows = {"prompt_id": ["a", "b"], "n": [4, 4], "n_correct": [1, 2], "problem": ["q", "r"]}
    source = tmp_path / name
    for answer, needle in ((0.1 + 0.2, "'answer' 0.30000000000000004"), (True, "'answer' true")):
        table = pl.DataFrame({**rows, "answer": [answer, answer]})
        if name.endswith(".jsonl"):
            table.write_ndjson(source)
        else:
            table.write_parquet(source)
        before = snapshot(real_dataset)
        code, message = import_into(monkeypatch, capsys, real_dataset, "counts", source)
        where = ":2" if name.endswith(".jsonl") else ": row 2"  # the last line shown
        assert code == 2 and f"{source}{where}: {needle} is not text or an integer" in message
        assert snapshot(real_dataset) == before
    new = {**rows, "prompt_id": ["c", "d"], "answer": [5, 6]}  # a, b hold other answers
    pl.DataFrame(new).write_parquet(source.with_suffix(".parquet"))
    args = ["counts", source.with_suffix(".parquet")]
    assert import_into(monkeypatch, capsys, real_dataset, *args)[0] == 0
    prompts = pl.read_parquet(real_dataset / "prompts.parquet")
    assert prompts.filter(pl.col("prompt_id") == "d")["answer"].to_list() == ["6"]


KEPT_COLUMNS = {  # (format, line 2 of a JSONL source, what the error says)
    "fractional tokens": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"n_tokens":3.7}', "'n_tokens' 3.7"
    ),
    "boolean tokens": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"n_tokens":true}', "'n_tokens' true"
    ),
    "number response": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"response":7}', "'response' 7"
    ),
    "number finish reason": (
        "long", '{"prompt_id":"b","sample_idx":0,"reward":1,"finish_reason":5}',
        "'finish_reason' 5",
    ),
    "fractional level": (
        "counts", '{"prompt_id":"b","n":4,"n_correct":1,"problem":"q","answer":"1","level":2.5}',
        "'level' 2.5",
    ),
    "number subject": (
        "counts", '{"prompt_id":"b","n":4,"n_correct":1,"problem":"q","answer":"1","subject":3}',
        "'subject' 3",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(KEPT_COLUMNS))
def test_import_refuses_kept_columns_the_store_would_change(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """Optional columns were cast to the store's types: 3.7 tokens became 3, a response 7
    the text "7", a level 2.5 the level 2."""
    fmt, line, needle = KEPT_COLUMNS[case]
    first = {
        "long": '{"prompt_id":"a","sample_idx":0,"reward":1}',
        "counts": '{"prompt_id":"a","n":4,"n_correct":1,"problem":"q","answer":"2"}',
    }[fmt]
    source = tmp_path / "s.jsonl"
    source.write_text(f"{first}\n{line}\n")
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}:2: {needle} is not " in message, message
    assert snapshot(real_dataset) == before


def test_import_prompts_table_values_are_not_cast(monkeypatch, capsys, real_dataset, tmp_path):
    """``--prompts FILE`` was cast to the store's types: an answer 0.1 + 0.2 became the text
    "0.30000000000000004" (a level 2.5 the level 2: the same check as counts' own)."""
    counts = tmp_path / "c.csv"
    counts.write_text("prompt_id,n,n_correct\nc,4,1\n")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt_id":"c","problem":"q","answer":0.30000000000000004,"level":2}\n')
    before = snapshot(real_dataset)
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(counts), "--policy", "new",
        "--out", str(real_dataset), "--prompts", str(prompts),
    )  # fmt: skip
    assert result[0] == 2 and f"{prompts}:1: 'answer' 0.30000000000000004 is not" in result[1]
    assert snapshot(real_dataset) == before


def test_eval_jsonl_keeps_responses_where_only_some_lines_have_them(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """A line without a responses list beside lines with one was a polars traceback (the
    lists to explode differed in length); its samples now have no response."""
    source = tmp_path / "e.jsonl"
    source.write_text('{"idx":0,"score":[1,0],"code":["a","b"]}\n{"idx":1,"score":[1]}\n')
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)[0] == 0
    rows = load_rollouts(real_dataset, ["new"]).sort("prompt_id", "sample_idx")
    assert rows["response"].to_list() == ["a", "b", None]


def test_acc_history_refuses_means_that_are_not_numbers(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """polars read a mean ``true`` as 1.0 and ``"0.5"`` as 0.5 (an id spelled "true" is
    fine)."""
    source = tmp_path / "h.json"
    for means, needle in (("[0.5, true]", "true"), ('["0.5"]', '"0.5"')):
        source.write_text(f'{{"true": [0.25], "b": {means}}}')
        before = snapshot(real_dataset)
        args = ("--rollouts-per-visit", "4")
        code, message = import_into(monkeypatch, capsys, real_dataset, "acc-history", source, *args)
        assert code == 2 and f"{source}: id 'b': mean reward {needle} is not a number" in message
        assert snapshot(real_dataset) == before


@pytest.mark.parametrize(
    ("fmt", "text", "flag", "column"),
    [
        ("long", "prompt_id,sample_idx,reward\na,0,1\n", "--policy-col", "who"),
        ("counts", "prompt_id,n,n_correct,problem\nc,4,1,q\n", "--problem-col", "question"),
        ("counts", "prompt_id,n,n_correct,problem\nc,4,1,q\n", "--answer-col", "gold"),
    ],
)
def test_import_refuses_a_named_column_the_source_lacks(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, text, flag, column
):
    """``--policy-col who`` on a table without it imported every row as the policy, and a
    misspelt ``--problem-col`` wrote no prompts: an option the user gave went unused."""
    source = tmp_path / "s.csv"
    source.write_text(text)
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, fmt, source, flag, column)
    assert code == 2 and f"missing column(s) {column!r} ({flag})" in message, message
    assert snapshot(real_dataset) == before


def test_eval_jsonl_without_questions_writes_no_empty_prompts(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """Lines without ``question`` made prompts with problem "" and answer "": into a dataset
    holding the prompt, the import was refused (answer "2" against ""); alone, it wrote empty
    problems."""
    source = tmp_path / "e.jsonl"
    source.write_text('{"idx":"a","score":[1,0]}\n')
    prompts = (real_dataset / "prompts.parquet").read_bytes()
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)[0] == 0
    assert (real_dataset / "prompts.parquet").read_bytes() == prompts
    out = tmp_path / "alone"
    args = ["import", "eval-jsonl", str(source), "--policy", "p", "--out", str(out)]
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert not (out / "prompts.parquet").exists()


def test_eval_jsonl_reads_an_integer_gold_answer_as_its_digits(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """Evaluators often log a numeric answer as a JSON integer: it is its digits exactly."""
    source = tmp_path / "e.jsonl"
    source.write_text('{"idx":0,"question":"1+4?","gt":5,"score":[1]}\n')
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source)[0] == 0
    prompts = pl.read_parquet(real_dataset / "prompts.parquet")
    assert prompts.filter(pl.col("prompt_id") == "0")["answer"].to_list() == ["5"]


NUMBER_POLICIES = {  # (file name, content, where the policy 1 is refused)
    "jsonl integers": ("l.jsonl", '{"prompt_id":"a","policy":1,"sample_idx":0,"reward":1}\n', ":1"),
    "jsonl float beside text": (
        "l.jsonl",
        '{"prompt_id":"a","policy":"b","sample_idx":0,"reward":1}\n'
        '{"prompt_id":"a","policy":1.0,"sample_idx":0,"reward":1}\n',
        ":2",
    ),
    "jsonl integer beside text": (
        "l.jsonl",
        '{"prompt_id":"a","policy":1,"sample_idx":0,"reward":1}\n'
        '{"prompt_id":"a","policy":"1","sample_idx":1,"reward":1}\n',
        ":1",
    ),
    "parquet integers": ("l.parquet", None, ": row 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NUMBER_POLICIES))
def test_long_import_refuses_a_policy_column_that_is_not_text(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """``--policy 1`` matched the text polars makes of a JSON 1 or 1.0 (and a Parquet
    integer column): a number silently named a policy. Policy names are text."""
    name, text, where = NUMBER_POLICIES[case]
    source = tmp_path / name
    if text is None:
        pl.DataFrame(
            {"prompt_id": ["a"], "policy": [1], "sample_idx": [0], "reward": [1.0]}
        ).write_parquet(source)
    else:
        source.write_text(text)
    before = snapshot(real_dataset)
    args = ["import", "long", str(source), "--policy", "1", "--out", str(real_dataset)]
    code, message, _ = run_main(monkeypatch, capsys, *args)
    assert code == 2 and f"{source}{where}: 'policy' 1" in message, message
    assert "is not text: write it as text" in message
    assert snapshot(real_dataset) == before


def test_import_refuses_a_column_named_twice_in_a_csv_header(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """polars read the first ``n`` and renamed the second: the value 5 was silently dropped."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct,n\na,4,1,5\n")
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", source)
    assert code == 2 and f"{source}:1: column 'n' appears twice in the header" in message
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize(
    ("text", "extra", "needle"),
    [
        (  # a misspelt field name went unused: no prompts written, exit 0
            '{"idx":"a","score":[1],"question":"1+1?","gt":"2"}\n',
            ["--problem-col", "quest"],
            "--problem-col 'quest': no line of",
        ),
        (
            '{"idx":"a","score":[1],"code":["2"]}\n',
            ["--response-field", "responses"],
            "--response-field 'responses': no line of",
        ),
        (  # line 2 would have written problem "" and answer "" for prompt b
            '{"idx":"a","score":[1],"question":"1+1?","gt":"2"}\n{"idx":"b","score":[0],"gt":"4"}\n',
            [],
            ":2: no 'question', which other lines have",
        ),
        (
            '{"idx":"a","score":[1],"question":"1+1?","gt":"2"}\n'
            '{"idx":"b","score":[0],"question":"2+2?"}\n',
            [],
            ":2: no 'gt', which other lines have",
        ),
    ],
)
def test_eval_jsonl_refuses_unused_field_names_and_partial_prompts(
    monkeypatch, capsys, real_dataset, tmp_path, text, extra, needle
):
    source = tmp_path / "e.jsonl"
    source.write_text(text)
    before = snapshot(real_dataset)
    code, message = import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", source, *extra)
    assert code == 2 and needle in message, message
    assert snapshot(real_dataset) == before
