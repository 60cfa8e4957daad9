"""`basis-bench import lm-eval`: lm-evaluation-harness `--log_samples` files, written here
line by line in the layout lm-eval's evaluator writes (one line per document and filter:
doc_id, doc, target, arguments, resps, filtered_resps, filter, metrics, the hashes, and
each metric's value)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from conftest import assert_one_line_error, run_main

from basis_bench.errors import InputError
from basis_bench.rollouts.importers import ImportOptions, import_sources
from basis_bench.rollouts.store import dataset_metadata, load_prompts, load_rollouts

GSM8K = [  # (question, target) of three gsm8k documents
    ("Janet has 3 apples and buys 2. How many?", "5"),
    ("A pen costs 4 dollars. What do 3 pens cost?", "12"),
    ("Tom reads 10 pages a day. How many in 7 days?", "70"),
]


def sample_line(
    doc_id: int, doc: dict, target: str, resps: list[str], filtered: object, name: str, **metrics
) -> str:
    """One line as lm-eval's evaluator logs it (a generate_until task)."""
    prompt = f"Question: {doc.get('question', '')}\nAnswer:"
    return json.dumps(
        {
            "doc_id": doc_id,
            "doc": doc,
            "target": target,
            "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": {"until": ["Question:"]}}},
            "resps": [resps],
            "filtered_resps": [filtered],
            "filter": name,
            "metrics": list(metrics),
            "doc_hash": f"d{doc_id}",
            "prompt_hash": f"p{doc_id}",
            "target_hash": f"t{doc_id}",
            **metrics,
        }
    )


def gsm8k_run(path: Path, answers: list[str]) -> Path:
    """A gsm8k run (repeats 1): per document a strict-match and a flexible-extract line;
    the strict filter only scores '#### N', the flexible one the last number."""
    lines = []
    for doc_id, ((question, target), said) in enumerate(zip(GSM8K, answers, strict=True)):
        output = f"The answer is {said}."
        doc = {"question": question, "answer": f"... #### {target}"}
        lines.append(sample_line(doc_id, doc, target, [output], "[invalid]", "strict-match",
                                 exact_match=0.0))  # fmt: skip
        lines.append(sample_line(doc_id, doc, target, [output], said, "flexible-extract",
                                 exact_match=float(said == target)))  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_seed_runs_of_a_task_become_samples_of_the_filter_and_metric_picked(
    tmp_path, monkeypatch, capsys
):
    seed0 = gsm8k_run(tmp_path / "samples_gsm8k_2026-01-01T00-00-00.jsonl", ["5", "13", "70"])
    seed1 = gsm8k_run(tmp_path / "samples_gsm8k_2026-01-02T00-00-00.jsonl", ["6", "12", "70"])
    done = run_main(
        monkeypatch, capsys, "import", "lm-eval", str(seed0), str(seed1), "--policy", "sft",
        "--filter", "flexible-extract", "--id-format", "gsm8k_{:04d}", "--out", str(tmp_path / "ds"),
    )  # fmt: skip
    assert done.code == 0, done.message
    rollouts = load_rollouts(tmp_path / "ds").sort("prompt_id", "sample_idx")
    assert rollouts["prompt_id"].to_list() == [f"gsm8k_{i:04d}" for i in (0, 0, 1, 1, 2, 2)]
    assert rollouts["sample_idx"].to_list() == [0, 1] * 3  # seed 0's line, then seed 1's
    assert rollouts["reward"].to_list() == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert rollouts["response"].to_list()[:2] == ["The answer is 5.", "The answer is 6."]
    prompts = load_prompts(tmp_path / "ds").sort("prompt_id")  # doc's question, lm-eval's target
    assert prompts["problem"].to_list() == [q for q, _ in GSM8K]
    assert prompts["answer"].to_list() == [t for _, t in GSM8K]
    (meta,) = dataset_metadata(tmp_path / "ds")
    assert meta["format"] == "lm-eval" and meta["order"] == "source"
    # the other filter's lines are another reading of the same outputs
    strict = import_sources(
        "lm-eval", [seed0, seed1], "sft", ImportOptions(filter_name="strict-match")
    )
    assert strict.rollouts["reward"].sum() == 0 and strict.rollouts.height == 6


def test_per_repeat_scores_are_samples_with_their_responses_and_a_scalar_is_one(tmp_path):
    """repeats = 3: a task whose process_results scores each repeat (a list) gives three
    samples with the three raw outputs; lm-eval's take_first gives one, the first output."""
    outputs = ["\\boxed{4}", "\\boxed{5}", "\\boxed{4}"]
    doc = {"problem": "What is 2+2?", "solution": "\\boxed{4}", "answer": "4"}
    each = tmp_path / "samples_math_each.jsonl"
    each.write_text(sample_line(7, doc, "4", outputs, outputs, "none", exact_match=[1, 0, True]))
    result = import_sources("lm-eval", [each], "p", ImportOptions())
    assert result.rollouts["reward"].to_list() == [1.0, 0.0, 1.0]
    assert result.rollouts["response"].to_list() == outputs
    assert result.rollouts["sample_idx"].to_list() == [0, 1, 2]
    assert result.prompts is not None and result.prompts["problem"].to_list() == [doc["problem"]]
    first = tmp_path / "samples_math_first.jsonl"
    first.write_text(sample_line(7, doc, "4", outputs, "\\boxed{4}", "none", exact_match=1))
    result = import_sources("lm-eval", [first], "p", ImportOptions(answer_col="solution"))
    assert result.rollouts["reward"].to_list() == [1.0]
    assert result.rollouts["response"].to_list() == ["\\boxed{4}"]
    assert result.prompts["answer"].to_list() == ["\\boxed{4}"]


def test_a_multiple_choice_task_reads_acc_without_responses(tmp_path):
    """loglikelihood requests (one per choice): resps are [logprob, is_greedy] pairs, not text."""
    lines = []
    for doc_id, acc in enumerate([1, 0, 1]):
        row = json.loads(sample_line(doc_id, {"question": f"q{doc_id}"}, 2, [], None, "none",
                                     acc=acc, acc_norm=1 - acc))  # fmt: skip
        row["resps"] = [[[-1.5, False]], [[-0.5, True]], [[-2.0, False]]]
        lines.append(json.dumps(row))
    path = tmp_path / "samples_arc_easy.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="hold metrics acc, acc_norm; pick one with --metric"):
        import_sources("lm-eval", [path], "p", ImportOptions())
    result = import_sources("lm-eval", [path], "p", ImportOptions(metric="acc"))
    assert result.rollouts["reward"].to_list() == [1.0, 0.0, 1.0]
    assert "response" not in result.rollouts.columns
    assert result.prompts["answer"].to_list() == ["2", "2", "2"]  # the target index, as written


def test_an_ambiguous_or_misspelt_choice_is_one_line_naming_the_choices(
    tmp_path, monkeypatch, capsys
):
    run = gsm8k_run(tmp_path / "samples_gsm8k.jsonl", ["5", "12", "70"])
    out = str(tmp_path / "ds")
    done = run_main(
        monkeypatch, capsys, "import", "lm-eval", str(run), "--policy", "p", "--out", out
    )
    assert_one_line_error(done, "filters strict-match, flexible-extract", "pick one with --filter")
    done = run_main(monkeypatch, capsys, "import", "lm-eval", str(run), "--policy", "p",
                    "--filter", "flexible", "--out", out)  # fmt: skip
    assert_one_line_error(done, "--filter 'flexible'", "strict-match, flexible-extract")
    done = run_main(monkeypatch, capsys, "import", "lm-eval", str(run), "--policy", "p",
                    "--filter", "strict-match", "--metric", "acc", "--out", out)  # fmt: skip
    assert_one_line_error(done, "--metric 'acc'", "metrics exact_match")
    assert not (tmp_path / "ds").exists()


def test_bad_lines_are_reported_with_file_and_line(tmp_path):
    doc = {"question": "q"}
    path = tmp_path / "samples_bad.jsonl"
    path.write_text(
        sample_line(0, doc, "1", ["a"], "1", "none", exact_match=1.0) + "\n"
        + sample_line(1, doc, "1", ["a"], "1", "none", exact_match="yes") + "\n"
        + "not json\n"
        + sample_line(3, doc, "1", ["a", "b"], ["1"], "none", exact_match=[1, 0, 1]) + "\n"
        + sample_line(0, doc, "1", ["a"], "1", "none", exact_match=0.0) + "\n"
    )  # fmt: skip
    with pytest.raises(InputError) as err:
        import_sources("lm-eval", [path], "p", ImportOptions())
    assert "samples_bad.jsonl:3: malformed JSON" in str(err.value)
    fixed = tmp_path / "samples_fixed.jsonl"
    fixed.write_text(
        "".join(line + "\n" for i, line in enumerate(path.read_text().splitlines()) if i != 2)
    )
    with pytest.raises(InputError) as err:
        import_sources("lm-eval", [fixed], "p", ImportOptions())
    message = str(err.value)
    assert "samples_fixed.jsonl:2: 'exact_match' is \"yes\", not a number" in message
    assert "samples_fixed.jsonl:3: 3 'exact_match' values but 2 responses" in message
    assert "samples_fixed.jsonl:4: duplicate doc_id in one file" in message


# --------------------------------------------------------------------------- issue 44, class 2

MATH = [("What is $2+2$?", "4"), ("Solve $x+1=3$.", "2"), ("Compute $3 \\cdot 3$.", "9")]


def math_run(path: Path, rows=MATH, ids=(0, 1, 2)) -> Path:
    lines = [
        sample_line(i, {"problem": q, "answer": a}, a, [f"so {a}"], a, "none", exact_match=1.0)
        for i, (q, a) in zip(ids, rows, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_two_tasks_with_the_same_doc_ids_are_refused_not_merged(tmp_path, monkeypatch, capsys):
    """samples_gsm8k.jsonl and samples_math.jsonl were merged by doc id: each gsm8k sample
    and the MATH sample of the same id under one prompt with the gsm8k text, exit 0."""
    gsm = gsm8k_run(tmp_path / "samples_gsm8k.jsonl", ["5", "12", "70"])
    lines = [ln for ln in gsm.read_text().splitlines() if '"flexible-extract"' in ln]
    gsm.write_text("\n".join(ln.replace("flexible-extract", "none") for ln in lines) + "\n")
    math = math_run(tmp_path / "samples_math.jsonl")
    out = tmp_path / "ds"
    args = ["import", "lm-eval", str(gsm), str(math), "--policy", "p", "--out", str(out)]
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(
        result, "prompt id '0' names two problems", "samples_gsm8k.jsonl:1", "samples_math.jsonl:1"
    )
    assert not out.exists()
    # the same task twice (one file per seed) is more samples of one prompt, as before
    again = math_run(tmp_path / "samples_math_seed1.jsonl")
    assert import_sources("lm-eval", [math, again], "p", ImportOptions()).rollouts.height == 6


@pytest.mark.parametrize("change", ["answer", "id kind"])
def test_one_doc_id_with_another_answer_or_id_kind_is_refused(tmp_path, change):
    """The same doc id with answers 4 and 5 merged and kept 4; ids "0" and 0 merged."""
    first = math_run(tmp_path / "samples_a.jsonl")
    if change == "answer":
        second = math_run(tmp_path / "samples_b.jsonl", [("What is $2+2$?", "5"), *MATH[1:]])
        needle = "'What is $2+2$?' with answer '4'"
    else:
        second = math_run(tmp_path / "samples_b.jsonl", ids=("0", "1", "2"))
        needle = "an integer id at"
    with pytest.raises(InputError) as err:
        import_sources("lm-eval", [first, second], "p", ImportOptions())
    assert "prompt id '0' names two problems" in str(err.value)
    assert needle in str(err.value)


def test_a_second_import_compares_the_problem_not_only_the_answer(tmp_path, monkeypatch, capsys):
    """It compared answers but never the problem: another task's doc 0 with the same answer
    was merged into the first's."""
    out = tmp_path / "ds"
    math = math_run(tmp_path / "samples_math.jsonl")
    args = ["import", "lm-eval", str(math), "--out", str(out), "--policy"]
    assert run_main(monkeypatch, capsys, *args, "a").code == 0
    other = math_run(tmp_path / "samples_other.jsonl", [("What is 1+3?", "4"), *MATH[1:]])
    before = _contents(out)
    result = run_main(
        monkeypatch, capsys, "import", "lm-eval", str(other), "--out", str(out), "--policy", "b"
    )
    assert_one_line_error(result, "already holds prompt 0 as the problem 'What is $2+2$?'")
    # nothing written, not even the new policy's folder (an empty rollouts/b was left)
    assert _contents(out) == before
    another = math_run(tmp_path / "samples_another.jsonl", [("What is $2+2$?", "5"), *MATH[1:]])
    result = run_main(
        monkeypatch, capsys, "import", "lm-eval", str(another), "--out", str(out), "--policy", "c"
    )
    assert_one_line_error(result, "already holds prompt 0 with answer '4'")
    assert _contents(out) == before


def _contents(folder: Path) -> dict[str, bytes | None]:
    """Every path below ``folder``, a file's bytes, a folder's None."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in folder.rglob("*")
    }


def test_eval_jsonl_files_merge_only_the_same_problem(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"idx": 0, "question": "1+1", "gt": "2", "score": [true]}\n')
    b.write_text('{"idx": 0, "question": "2+3", "gt": "5", "score": [false]}\n')
    with pytest.raises(InputError, match=r"prompt id '0' names two problems: '1\+1' with"):
        import_sources("eval-jsonl", [a, b], "p", ImportOptions())
    b.write_text('{"idx": 0, "question": "1+1", "gt": "2", "score": [false]}\n')
    assert import_sources("eval-jsonl", [a, b], "p", ImportOptions()).rollouts.height == 2


# --------------------------------------------------------------------------- issue 44, class 5


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ({"doc": {"problem": "", "answer": "4"}}, "doc's 'problem' is empty"),
        ({"doc": {"problem": "   ", "answer": "4"}}, "doc's 'problem' is empty"),
        ({"target": 4.0}, "'target' is 4.0, not text or an integer"),
        ({"target": None}, "'target' is null, not text or an integer"),
        ({"target": ["4"]}, "'target' is [\"4\"], not text or an integer"),
        ({"exact_match": 10**400}, "'exact_match' is 1000"),
        ({"metrics": ["doc_id"]}, "the lines hold no metric (a field lm-eval writes on every"),
    ],
)
def test_values_the_docs_promise_to_refuse_are_refused_at_their_line(tmp_path, edit, needle):
    """An empty question was stored; a float, null or list target became the answer '';
    a 400-digit metric raised OverflowError; "metrics": ["doc_id"] made doc ids rewards."""
    path = math_run(tmp_path / "samples_math.jsonl")
    lines = path.read_text().splitlines()
    row = json.loads(lines[0]) | edit
    if "metrics" in edit:
        rows = [json.loads(line) | edit for line in lines]
        for r in rows:
            del r["exact_match"]
        lines = [json.dumps(r) for r in rows]
    else:
        lines[0] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        import_sources("lm-eval", [path], "p", ImportOptions())
    assert needle in str(err.value)
    if "metrics" not in edit:
        assert "samples_math.jsonl:1:" in str(err.value)


def test_a_400_digit_eval_jsonl_score_is_refused_at_its_line(tmp_path):
    """float(10**400) raised OverflowError, a traceback (found beside class 5's lm-eval case)."""
    path = tmp_path / "e.jsonl"
    path.write_text(f'{{"idx": 0, "question": "1+1", "gt": "2", "score": [{10**400}]}}\n')
    with pytest.raises(InputError, match=r"e\.jsonl:1: 'score' must be a list of booleans"):
        import_sources("eval-jsonl", [path], "p", ImportOptions())


def test_a_gsm8k_full_solution_target_is_stored_as_its_final_answer(tmp_path):
    """lm-eval's gsm8k target is the document's whole answer, the worked solution ending in
    '#### 42'; that became the stored answer, which math-verify cannot match a response
    against. The final answer after '####' is stored; a plain target stays as it is."""
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"
    doc = {"question": "Natalia sold clips to 48 friends ...", "answer": solution}
    path = tmp_path / "samples_gsm8k_full.jsonl"
    lines = [
        sample_line(0, doc, solution, ["... so 72."], "72", "flexible-extract", exact_match=1.0),
        sample_line(
            1,
            {**doc, "question": "Other?"},
            "#### 1,000 ",
            ["1000"],
            "1000",
            "flexible-extract",
            exact_match=1.0,
        ),
        sample_line(
            2,
            {**doc, "question": "Plain?"},
            "12",
            ["12"],
            "12",
            "flexible-extract",
            exact_match=1.0,
        ),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = import_sources("lm-eval", [path], "p", ImportOptions())
    assert result.prompts is not None
    assert result.prompts.sort("prompt_id")["answer"].to_list() == ["72", "1,000", "12"]
    from_doc = import_sources("lm-eval", [path], "p", ImportOptions(answer_col="answer"))
    assert from_doc.prompts is not None and from_doc.prompts["answer"].to_list()[0] == "72"


# A samples file lm-eval 0.4.13 wrote (not made here): docs/schema.md's gsm8k_n8 task run
# as written with 4 repeats and 48 new tokens, SmolLM2-135M on a CPU, --limit 3 documents.
REAL_RUN = Path(__file__).parent / "data" / "lm_eval_0_4_13_gsm8k_n4_samples.jsonl"


def test_the_documented_recipe_run_by_lm_eval_gives_n_scored_samples_a_document():
    """Each document's 4 sampled responses are 4 samples with their scores, the answer is
    the final number of gsm8k's worked solution, and the recipe's utils.py, run on the
    file's filtered responses, gives the scores lm-eval logged."""
    lines = [json.loads(line) for line in REAL_RUN.read_text(encoding="utf-8").splitlines()]
    options = ImportOptions(filter_name="per-sample", metric="exact_match", answer_col="answer")
    result = import_sources("lm-eval", [REAL_RUN], "smol", options)
    assert result.prompts is not None
    for line in lines:
        rows = result.rollouts.filter(pl.col("prompt_id") == str(line["doc_id"]))
        assert rows.sort("sample_idx")["reward"].to_list() == line["exact_match"]
        assert rows.sort("sample_idx")["response"].to_list() == line["resps"][0]
        prompt = result.prompts.filter(pl.col("prompt_id") == str(line["doc_id"]))
        assert prompt["answer"].item() == line["doc"]["answer"].split("####")[-1].strip()
    assert result.rollouts.height == 4 * len(lines)
    schema = (Path(__file__).resolve().parents[1] / "docs" / "schema.md").read_text()
    utils = re.search(r"```python\n(def process_results.*?)```", schema, re.S)
    assert utils is not None
    recipe: dict[str, Any] = {}
    exec(utils.group(1), recipe)  # the doc's utils.py, as lm-eval imports it
    for line in lines:
        scored = recipe["process_results"](line["doc"], line["filtered_resps"])
        assert scored == {"exact_match": line["exact_match"]}
    scores = [line["exact_match"] for line in lines]
    assert recipe["mean_over_samples"](scores) == pytest.approx(1 / 12)  # lm-eval: 0.0833


def test_each_file_gives_its_problems_by_its_own_field(tmp_path):
    """gsm8k's docs say question, MATH's problem: the field was chosen once for all files,
    so gsm8k's problems were stored as empty text, exit 0 (and an empty problem says nothing
    to a later import's identity check)."""
    gsm = gsm8k_run(tmp_path / "samples_gsm8k.jsonl", ["5", "12", "70"])
    lines = [ln for ln in gsm.read_text().splitlines() if '"flexible-extract"' in ln]
    gsm.write_text("\n".join(ln.replace("flexible-extract", "none") for ln in lines) + "\n")
    math = math_run(tmp_path / "samples_math.jsonl", ids=(10, 11, 12))
    prompts = import_sources("lm-eval", [gsm, math], "p", ImportOptions()).prompts
    assert prompts is not None
    by_id = dict(zip(prompts["prompt_id"], prompts["problem"], strict=True))
    assert [by_id[i] for i in ("0", "1", "2")] == [q for q, _ in GSM8K]
    assert [by_id[i] for i in ("10", "11", "12")] == [q for q, _ in MATH]
