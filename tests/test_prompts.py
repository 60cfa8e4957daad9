"""Prompt sources (MATH, DAPO, arithmetic), stable ids, bad files, and chat templates."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import polars as pl
import pytest

from basis_bench.errors import InputError
from basis_bench.rollouts.prompts import (
    DAPO_PREFIX,
    DAPO_SUFFIX,
    arithmetic_prompts,
    load_prompt_source,
    parse_arithmetic_spec,
    parse_levels,
    prompt_id,
)
from basis_bench.rollouts.records import read_records
from basis_bench.rollouts.store import conform_prompts
from basis_bench.rollouts.templates import (
    DEFAULT_INSTRUCTION,
    FAMILY_INSTRUCTIONS,
    PromptTemplate,
    build_prompt,
    default_instruction,
)

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "math_sample.jsonl"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_prompt_id_is_a_hash_of_the_problem_text():
    assert prompt_id("What is 1 + 1?") == hashlib.sha256(b"What is 1 + 1?").hexdigest()[:16]
    assert prompt_id("What is 1 + 1?") != prompt_id("What is 1 + 2?")


def test_math_sample_loads_with_levels_and_limit():
    df = load_prompt_source(str(SAMPLE))
    assert df.height == 30
    assert sorted(df["level"].unique().to_list()) == [3, 4, 5]
    assert conform_prompts(df).height == 30
    assert df["prompt_id"].to_list() == [prompt_id(p) for p in df["problem"]]
    only5 = load_prompt_source(str(SAMPLE), levels=[5])
    assert only5.height == 10 and set(only5["level"]) == {5}
    assert load_prompt_source(str(SAMPLE), levels=[4, 5], limit=3)["level"].to_list() == [4, 4, 4]


def test_same_problem_gets_the_same_id_in_every_file_format(tmp_path):
    jsonl = load_prompt_source(str(SAMPLE))
    raw = read_records(SAMPLE)
    raw.write_parquet(tmp_path / "math.parquet")
    (tmp_path / "math.json").write_text(json.dumps(raw.to_dicts()))
    for name in ("math.parquet", "math.json"):
        assert (
            load_prompt_source(str(tmp_path / name))["prompt_id"].to_list()
            == jsonl["prompt_id"].to_list()
        )


def test_math_rows_with_solution_only_level_strings_and_type(tmp_path):
    rows = [
        {
            "problem": "P1",
            "solution": "so \\boxed{\\frac{1}{2}}.",
            "level": "Level 3",
            "type": "Algebra",
        },
        {
            "problem": "P2",
            "solution": "\\boxed{1} then \\boxed{2}",
            "level": "Level 5",
            "type": "Geometry",
        },
        {
            "problem": "P3",
            "solution": "no boxed answer here",
            "level": "Level 4",
            "type": "Algebra",
        },
        {
            "problem": "P1",
            "solution": "duplicate \\boxed{9}",
            "level": "Level 3",
            "type": "Algebra",
        },
    ]
    with pytest.warns(UserWarning, match="skipped 1 problem"):
        df = load_prompt_source(str(write_jsonl(tmp_path / "m.jsonl", rows)))
    assert df["problem"].to_list() == ["P1", "P2"]  # no answer dropped, repeat kept once
    assert df["answer"].to_list() == ["\\frac{1}{2}", "2"]
    assert df["level"].to_list() == [3, 5]
    assert df["subject"].to_list() == ["Algebra", "Geometry"]


def test_malformed_jsonl_line_reports_its_line_number(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n\n{"problem": "b", "answer": \n')
    with pytest.raises(InputError, match=r"bad\.jsonl:3: not a JSON record"):
        load_prompt_source(str(path))
    path.write_text('{"problem": "a", "answer": "1"}\n[1, 2]\n')
    with pytest.raises(InputError, match=r":2: not a JSON record \(a list\)"):
        load_prompt_source(str(path))


def test_rows_with_clashing_field_types(tmp_path):
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [{"problem": "a", "answer": [1]}, {"problem": "b", "answer": {"k": 1}}],
    )
    with pytest.raises(InputError, match="field types"):
        load_prompt_source(str(path))


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_prompt_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(InputError, match="empty"):
        load_prompt_source(str(path))


def test_bad_sources(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_prompt_source(str(tmp_path / "missing.jsonl"))
    (tmp_path / "p.csv").write_text("problem,answer\n")
    with pytest.raises(InputError, match="unsupported prompt file type"):
        load_prompt_source(str(tmp_path / "p.csv"))
    write_jsonl(tmp_path / "q.jsonl", [{"question": "x", "answer": "1"}])
    with pytest.raises(InputError, match="'problem' column"):
        load_prompt_source(str(tmp_path / "q.jsonl"))
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="not a readable Parquet"):
        load_prompt_source(str(tmp_path / "x.parquet"))


def test_levels_need_a_level_column_and_a_match(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [{"problem": "P", "answer": "1"}])
    with pytest.raises(InputError, match="no level column"):
        load_prompt_source(str(path), levels=[3])
    with pytest.raises(InputError, match="no prompts at levels"):
        load_prompt_source(str(SAMPLE), levels=[1])
    with pytest.raises(InputError, match="arithmetic"):
        load_prompt_source("arithmetic:n=3", levels=[3])
    with pytest.raises(InputError, match="--limit"):
        load_prompt_source(str(SAMPLE), limit=0)


def dapo_original_rows() -> list[dict]:
    def row(problem: str, answer: str, index: int) -> dict:
        return {
            "data_source": "math_dapo",
            "prompt": [{"content": DAPO_PREFIX + problem + DAPO_SUFFIX, "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": f"id-{index}"},
        }

    # The original release repeats each problem; the loader keeps one.
    return [
        row("Find $x$ if $2x = 34$.", "17", 0),
        row("Compute $3^3$.", "27", 1),
        row("Find $x$ if $2x = 34$.", "17", 2),
    ]


def test_dapo_original_parquet(tmp_path):
    path = tmp_path / "dapo-math-17k.parquet"
    pl.DataFrame(dapo_original_rows()).write_parquet(path)
    df = load_prompt_source(str(path))
    assert df["problem"].to_list() == ["Find $x$ if $2x = 34$.", "Compute $3^3$."]
    assert df["answer"].to_list() == ["17", "27"]
    assert df["prompt_id"].to_list() == [prompt_id(p) for p in df["problem"]]


def test_dapo_jsonl_and_processed_string_prompts(tmp_path):
    jsonl = load_prompt_source(str(write_jsonl(tmp_path / "dapo.jsonl", dapo_original_rows())))
    assert jsonl["answer"].to_list() == ["17", "27"]
    processed = write_jsonl(
        tmp_path / "processed.jsonl",
        [{"prompt": "Compute $3^3$.", "solution": "27", "data_source": "math_dapo"}],
    )
    df = load_prompt_source(str(processed))
    assert df["problem"].to_list() == ["Compute $3^3$."]
    assert df["prompt_id"].to_list() == [jsonl["prompt_id"][1]]


def test_hub_source_without_datasets_asks_for_a_local_path():
    if importlib.util.find_spec("datasets") is not None:
        pytest.skip("the 'datasets' package is installed; this checks the message when it is not")
    with pytest.raises(InputError, match="local JSONL/Parquet path"):
        load_prompt_source("hf:BytedTsinghua-SIA/DAPO-Math-17k")


def safe_eval(expression: str) -> int:
    return int(eval(expression, {"__builtins__": {}}, {}))


def test_arithmetic_answers_are_correct_and_difficulty_is_controlled():
    df = arithmetic_prompts(200, digits=(1, 3), steps=(1, 4), operations="+-*", seed=3)
    assert df.height == 200 and df["prompt_id"].n_unique() == 200
    for row in df.iter_rows(named=True):
        expression = row["problem"].removeprefix("What is ").removesuffix("?")
        assert safe_eval(expression) == int(row["answer"])
        operands = expression.split(" ")[::2]
        assert len(operands) == row["steps"] + 1
        assert all(len(o) == row["digits"] or (row["digits"] == 1 and o == "0") for o in operands)
    assert set(df["digits"]) == {1, 2, 3}
    assert set(df["steps"]) == {1, 2, 3, 4}


def test_arithmetic_is_deterministic_in_seed_and_respects_operations():
    a = arithmetic_prompts(20, digits=2, steps=2, operations="+", seed=0)
    assert a.equals(arithmetic_prompts(20, digits=2, steps=2, operations="+", seed=0))
    assert not a.equals(arithmetic_prompts(20, digits=2, steps=2, operations="+", seed=1))
    assert all("-" not in p and "*" not in p for p in a["problem"])
    assert arithmetic_prompts(50, digits=2, steps=2, operations="+", seed=0).head(20).equals(a)


def test_arithmetic_bad_settings():
    with pytest.raises(InputError, match="only 100 distinct"):
        arithmetic_prompts(101, digits=1, steps=1, operations="+")
    with pytest.raises(InputError, match="operations"):
        arithmetic_prompts(5, operations="/")
    with pytest.raises(InputError, match="digits"):
        arithmetic_prompts(5, digits=0)
    with pytest.raises(InputError, match="steps"):
        arithmetic_prompts(5, steps=(3, 2))


def test_arithmetic_source_spec():
    assert parse_arithmetic_spec("n=50,digits=1-2,steps=2,ops=+*,seed=4") == {
        "n": 50,
        "digits": (1, 2),
        "steps": (2, 2),
        "operations": "+*",
        "seed": 4,
    }
    df = load_prompt_source("arithmetic:n=7,digits=1,steps=1,ops=+", limit=5)
    assert df.height == 5 and set(df["subject"]) == {"arithmetic"}
    assert load_prompt_source("arithmetic").height == 100
    for bad in ("arithmetic:n", "arithmetic:size=3", "arithmetic:n=x", "arithmetic:digits=1-b"):
        with pytest.raises(InputError, match="arithmetic"):
            load_prompt_source(bad)
    for twice in ("n=5,n=7", "ops=+,operations=*"):  # the later value silently won
        with pytest.raises(InputError, match="is given twice"):
            parse_arithmetic_spec(twice)


def test_parse_levels():
    assert parse_levels("3-5") == [3, 4, 5]
    assert parse_levels("3,5") == [3, 5]
    assert parse_levels("1-2,5") == [1, 2, 5]
    for bad in ("", "three", "3-", "5-3", "3,,4"):
        with pytest.raises(InputError, match="--levels"):
            parse_levels(bad)


@pytest.fixture(scope="module")
def smol_tokenizer():
    from basis_bench.rollouts.models import load_tokenizer, resolve_checkpoint

    return load_tokenizer(resolve_checkpoint("smollm2-135m"))


def test_build_prompt_uses_the_chat_template(smol_tokenizer):
    text = build_prompt(smol_tokenizer, "What is 2 + 2?")
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert f"<|im_start|>user\nWhat is 2 + 2?\n\n{DEFAULT_INSTRUCTION}<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_build_prompt_with_custom_instruction_and_system(smol_tokenizer):
    template = PromptTemplate(instruction="Answer in \\boxed{}.", system="You are terse.")
    text = build_prompt(smol_tokenizer, "What is 2 + 2?", template)
    assert text.startswith("<|im_start|>system\nYou are terse.<|im_end|>")
    assert "SmolLM" not in text
    assert "What is 2 + 2?\n\nAnswer in \\boxed{}.<|im_end|>" in text
    bare = build_prompt(smol_tokenizer, "What is 2 + 2?", PromptTemplate(instruction=""))
    assert "<|im_start|>user\nWhat is 2 + 2?<|im_end|>" in bare


def test_build_prompt_without_a_chat_template(smol_tokenizer):
    template_text = smol_tokenizer.chat_template
    smol_tokenizer.chat_template = None
    try:
        assert build_prompt(smol_tokenizer, "Q?") == f"Q?\n\n{DEFAULT_INSTRUCTION}\n\n"
    finally:
        smol_tokenizer.chat_template = template_text


def test_default_instruction_by_prompt_family():
    # Arithmetic is graded on its last number: one short line of working ending in it
    # (what SmolLM2 can do; docs/oracle.md has what each candidate scored).
    assert default_instruction("arithmetic:n=4,seed=5") == FAMILY_INSTRUCTIONS["arithmetic"]
    assert FAMILY_INSTRUCTIONS["arithmetic"] != DEFAULT_INSTRUCTION
    assert default_instruction("data/math.jsonl") == DEFAULT_INSTRUCTION
    assert default_instruction("hf:HuggingFaceH4/MATH-500") == DEFAULT_INSTRUCTION
