"""``basis-bench import``'s refusals of destinations, encodings, ids and sizes (issues 14
and 22): each is one line and changes no byte of the dataset it was pointed at.

Fields, columns and value types are in ``test_failures_import_fields.py``.
"""

from __future__ import annotations

import polars as pl
import pytest
from conftest import assert_one_line_error, import_into, refused_import, run_main, snapshot

from basis_bench.errors import InputError
from basis_bench.guards.outputs import claim_output_dir
from basis_bench.rollouts.store import load_rollouts

# --------------------------------------------------------------------------- import --out


def test_a_dataset_inside_another_is_refused(
    monkeypatch, capsys, real_dataset, sim_dataset, tmp_path
):
    """import --out DATASET/rollouts wrote a nested dataset: its rows were read as the outer
    one's, its prompts.parquet was not."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,3\n")
    before = snapshot(real_dataset)
    for inner in (real_dataset / "rollouts", real_dataset / "more"):
        code, message = import_into(monkeypatch, capsys, inner, "counts", source)
        assert code == 2 and f"is inside the rollouts dataset {real_dataset}" in message
    assert snapshot(real_dataset) == before
    with pytest.raises(InputError, match="inside the rollouts dataset"):
        claim_output_dir(sim_dataset / "rollouts", "rollouts")  # by its marker
    claim_output_dir(sim_dataset / "rollouts", "rollouts", force=True)


# --------------------------------------------------------------------------- import


def test_import_refuses_a_simulated_dataset_and_a_training_run(
    monkeypatch, capsys, sim_dataset, tmp_path
):
    counts = tmp_path / "c.csv"
    counts.write_text("prompt_id,n,n_correct\nsim-00,4,1\n")
    before = snapshot(sim_dataset)
    args = ["import", "counts", str(counts), "--policy", "ck", "--out"]
    result = run_main(monkeypatch, capsys, *args, str(sim_dataset))
    assert_one_line_error(result, "simulated rollouts", "would mix")
    assert snapshot(sim_dataset) == before
    run = claim_output_dir(tmp_path / "run", "train-run")
    assert_one_line_error(run_main(monkeypatch, capsys, *args, str(run)), "training run")
    assert run_main(monkeypatch, capsys, *args, str(run), "--force")[0] == 0


NOT_UTF8 = [  # (format, file name, bytes with a Latin-1 byte on line 3)
    ("counts", "c.csv", b"prompt_id,n,n_correct\na,4,1\ncaf\xe9,4,2\n"),
    ("counts", "c.tsv", b"prompt_id\tn\tn_correct\na\t4\t1\ncaf\xe9\t4\t2\n"),
    ("counts", "c.jsonl", b'{"prompt_id":"a","n":4,"n_correct":1}\n\n{"prompt_id":"caf\xe9"}\n'),
    ("eval-jsonl", "e.jsonl", b'{"idx":1,"score":[true]}\n\n{"idx":"caf\xe9","score":[true]}\n'),
    ("long", "l.csv", b"prompt_id,sample_idx,reward\na,0,1\ncaf\xe9,0,1\n"),
    ("acc-history", "h.json", b'{"a": [0.5],\n "b": [0.25],\n "caf\xe9": [1.0]}\n'),
]  # fmt: skip


@pytest.mark.parametrize("fmt, name, data", NOT_UTF8, ids=[f"{f}-{n}" for f, n, _ in NOT_UTF8])
def test_import_refuses_text_that_is_not_utf8_naming_the_line(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, name, data
):
    """Replacement characters would let two distinct ids collide: refused, not coerced."""
    source = tmp_path / name
    source.write_bytes(data)
    result = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert_one_line_error(result, f"{source}:3: not UTF-8 text", "0xe9")


def test_import_refuses_parquet_bytes_lists_and_wild_id_formats(
    monkeypatch, capsys, real_dataset, tmp_path
):
    """Each once a polars traceback: a byte-string id that is not UTF-8, a list where one
    value per row belongs, a zero-padding width of a trillion digits."""
    before = snapshot(real_dataset)
    binary = tmp_path / "b.parquet"
    pl.DataFrame({"prompt_id": [b"a", b"caf\xe9"], "n": [4, 4], "n_correct": [1, 2]}).write_parquet(
        binary
    )
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(binary), "--policy", "new",
        "--out", str(real_dataset),
    )  # fmt: skip
    assert_one_line_error(result, f"{binary}: row 2: column 'prompt_id' is not UTF-8 text")
    lists = tmp_path / "l.parquet"
    pl.DataFrame({"prompt_id": ["a"], "sample_idx": [0], "reward": [[1.0]]}).write_parquet(lists)
    result = run_main(
        monkeypatch, capsys, "import", "long", str(lists), "--policy", "new",
        "--out", str(real_dataset),
    )  # fmt: skip
    assert_one_line_error(result, "column 'reward' holds List(Float64), not one value per row")
    counts = tmp_path / "c.csv"
    counts.write_text("prompt_id,n,n_correct\n7,4,1\n")
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(counts), "--policy", "new",
        "--out", str(real_dataset), "--id-format", "p{:0999999999999d}",
    )  # fmt: skip
    assert_one_line_error(result, "--id-format", "N up to 64")
    assert snapshot(real_dataset) == before
    pl.DataFrame({"prompt_id": [b"a"], "n": [4], "n_correct": [1]}).write_parquet(binary)
    assert import_into(monkeypatch, capsys, real_dataset, "counts", binary)[0] == 0


ODD_IDS = {  # (format, file name, text, what the error says at which line)
    "int beside text": (
        "eval-jsonl", "e.jsonl", '{"idx":7,"score":[1]}\n{"idx":"8","score":[0]}\n',
        ':2: \'idx\' "8" is text but the file\'s first id is an integer',
    ),
    "text beside int": (
        "counts", "c.jsonl",
        '{"prompt_id":"a","n":4,"n_correct":1}\n{"prompt_id":8,"n":4,"n_correct":1}\n',
        ":2: 'prompt_id' 8 is an integer but the file's first id is text",
    ),
    "float": ("eval-jsonl", "e.jsonl", '{"idx":7.0,"score":[1]}\n', ":1: 'idx' 7.0 is not text"),
    "boolean": (
        "eval-jsonl", "e.jsonl", '{"idx":1,"score":[1]}\n{"idx":true,"score":[1]}\n',
        ":2: 'idx' true is not text or an integer",
    ),
    "list": (
        "long", "l.jsonl",
        '{"prompt_id":1,"sample_idx":0,"reward":1}\n{"prompt_id":[1],"sample_idx":0,"reward":1}\n',
        ":2: 'prompt_id' [1] is not text or an integer",
    ),
    "padded csv": (
        "counts", "c.csv", "prompt_id,n,n_correct\na,4,1\n a,4,2\n",
        ":3: 'prompt_id' \" a\" has leading or trailing whitespace (ids are used exactly)",
    ),
    "padded jsonl": (
        "eval-jsonl", "e.jsonl", '{"idx":"a ","score":[1]}\n',
        ":1: 'idx' \"a \" has leading or trailing whitespace",
    ),
    "padded key": (
        "acc-history", "h.json", '{"a": [0.5], "b\\t": [0.25]}',
        ": id 'b\\t': 'id' \"b\\t\" has leading or trailing whitespace",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ODD_IDS))
def test_import_uses_ids_exactly_or_refuses_them_naming_the_line(
    monkeypatch, capsys, real_dataset, tmp_path, case
):
    """An id is text (used as it is, never stripped) or an integer (its decimal digits); an
    integer 7 beside a text "7" in one file, a float, boolean or list id, and padded text
    were once read as text ("7", "true", "a"), so distinct ids could collide."""
    fmt, name, text, needle = ODD_IDS[case]
    source = tmp_path / name
    source.write_text(text)
    code, message, _ = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert code == 2 and f"{source}{needle}" in message, message


def test_import_reads_integer_ids_as_their_digits(monkeypatch, capsys, real_dataset, tmp_path):
    """The documented eval-jsonl shape (integer ``idx``) and an integer Parquet id column
    give the same prompt ids as text "0", "1"; a float id column is refused by row."""
    lines = tmp_path / "e.jsonl"
    lines.write_text('{"idx":0,"score":[true,false]}\n{"idx":1,"score":[1,1]}\n')
    assert import_into(monkeypatch, capsys, real_dataset, "eval-jsonl", lines)[0] == 0
    ids = load_rollouts(real_dataset, ["new"])["prompt_id"].unique().sort().to_list()
    assert ids == ["0", "1"]
    table = tmp_path / "c.parquet"
    pl.DataFrame({"prompt_id": [0, 1], "n": [4, 4], "n_correct": [1, 2]}).write_parquet(table)
    args = ["import", "counts", str(table), "--policy", "ints", "--out", str(real_dataset)]
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    assert load_rollouts(real_dataset, ["ints"])["prompt_id"].unique().sort().to_list() == ids
    pl.DataFrame({"prompt_id": [0.0], "n": [4], "n_correct": [1]}).write_parquet(table)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", table)
    assert code == 2 and f"{table}: row 1: 'prompt_id' 0.0 is not text" in message, message


def test_import_refuses_a_second_reference_policy(monkeypatch, capsys, real_dataset, tmp_path):
    """Once written silently: files that disagree on the reference make every later evaluate
    stop ("files disagree on the reference policy"). Replacing the reference itself is fine."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\nb,4,2\n")
    assert import_into(monkeypatch, capsys, real_dataset, "counts", source, "--reference")[0] == 0
    before = snapshot(real_dataset)
    args = ["import", "counts", str(source), "--out", str(real_dataset), "--reference"]
    result = run_main(monkeypatch, capsys, *args, "--policy", "other")
    assert_one_line_error(result, "already names 'new' as its reference policy", "rollouts/new/")
    assert snapshot(real_dataset) == before
    assert run_main(monkeypatch, capsys, *args, "--policy", "new", "--replace").code == 0


def test_import_refuses_counts_that_cannot_fit_in_memory_before_allocating(
    monkeypatch, capsys, real_dataset, tmp_path
):
    source = tmp_path / "c.csv"  # 40 x 2e9 = 8e10 rollouts: terabytes, on any machine
    source.write_text(
        "prompt_id,n,n_correct\n" + "".join(f"p{i},2000000000,1\n" for i in range(40))
    )
    history = tmp_path / "h.json"
    history.write_text('{"a": [0.5, 0.5, 0.5]}')
    before = snapshot(real_dataset)
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(source), "--policy", "new",
        "--out", str(real_dataset),
    )  # fmt: skip
    assert_one_line_error(result, "makes 80,000,000,000 rollouts", "GiB of memory is free")
    result = run_main(
        monkeypatch, capsys, "import", "acc-history", str(history), "--policy", "new",
        "--out", str(real_dataset), "--rollouts-per-visit", "1000000000000",
    )  # fmt: skip
    assert_one_line_error(result, "--rollouts-per-visit must be in [1, 2147483647]")
    assert snapshot(real_dataset) == before


@pytest.mark.parametrize(
    "fmt, name, text",
    [
        ("counts", "c.csv", "prompt_id,n,n_correct\n"),
        ("counts", "c.tsv", "prompt_id\tn\tn_correct\n"),
        ("acc-history", "h.json", "{}"),
        ("acc-history", "h.json", '{"a": [], "b": []}'),
    ],
)
def test_import_refuses_a_source_without_rows(
    monkeypatch, capsys, real_dataset, tmp_path, fmt, name, text
):
    source = tmp_path / name
    source.write_text(text)
    result = refused_import(monkeypatch, capsys, tmp_path / "fresh", fmt, source)
    assert_one_line_error(result, "no rollouts to import")
    assert not (tmp_path / "fresh").exists()
    result = refused_import(monkeypatch, capsys, real_dataset, fmt, source)
    assert_one_line_error(result, "no rollouts to import")
    parquet = tmp_path / "empty.parquet"
    pl.DataFrame(
        schema={"prompt_id": pl.String, "n": pl.Int64, "n_correct": pl.Int64}
    ).write_parquet(parquet)
    code, message = import_into(monkeypatch, capsys, real_dataset, "counts", parquet)
    assert code == 2 and "no rollouts to import" in message


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


@pytest.mark.parametrize("fmt", ["eval-jsonl", "counts"])
def test_import_refuses_a_source_given_twice(monkeypatch, capsys, real_dataset, tmp_path, fmt):
    """eval-jsonl read a file named twice as two seeds: every sample counted twice."""
    source = tmp_path / "s.jsonl"
    source.write_text(
        '{"idx":0,"score":[1,0]}\n'
        if fmt == "eval-jsonl"
        else '{"prompt_id":"a","n":4,"n_correct":1}\n'
    )
    before = snapshot(real_dataset)
    args = ["import", fmt, str(source), str(tmp_path / "." / "s.jsonl"), "--policy", "new"]
    result = run_main(monkeypatch, capsys, *args, "--out", str(real_dataset))
    assert_one_line_error(result, f"source '{tmp_path / '.' / 's.jsonl'}' is given twice")
    assert snapshot(real_dataset) == before
