"""Each setting is declared once: read from the source, so a second declaration fails here
before anyone has to notice two help texts or two defaults drifting apart (issue 43).

A setting is a ``setting()`` field of a class. A name declared in two classes is allowed
only where it means different things there (ALLOWED, reviewed: the classes are listed, so a
third declaration is reviewed again), or where the merge is planned and not yet done
(NOT_YET_ONE, each with who does it; the test fails when one is merged, so the list only
shrinks). Shared concerns are sections (:func:`basis_bench.settings.section`): Generation
and Grading are held whole by the oracle's job and training's config.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from basis_bench.rollouts.generation import Generation
from basis_bench.rollouts.grading import Grading
from basis_bench.rollouts.oracle_job import OracleJob
from basis_bench.settings import flat_keys, setting_default
from basis_bench.train.config import TrainConfig, make_config

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "basis_bench"

ALLOWED = {  # one name, different meanings: reviewed
    "seed": {  # each command's own random stream
        "rollouts/importers/options.py:ImportOptions",
        "rollouts/oracle_job.py:OracleJob",
        "rollouts/simulation.py:SimulationConfig",
        "train/config.py:TrainConfig",
    },
    "batch_size": {  # sequences decoded together / prompts per batch draw B
        "evaluation/config.py:EvaluateConfig",
        "rollouts/generation.py:Generation",
    },
    "loss": {  # the policy loss / BASIS's calibration loss
        "train/config.py:TrainConfig",
        "estimators/options.py:BasisOptions",
        "estimators/memory.py:MemoryOptions",
    },
}

NOT_YET_ONE = {  # one meaning, still declared twice: the merge is planned
    # issue 43 item 2 (evaluate's and sensitivity's settings as sections)
    "basis_options": {
        "evaluation/config.py:EvaluateConfig",
        "evaluation/config.py:SensitivityConfig",
    },
    "estimator_options": {
        "evaluation/config.py:EvaluateConfig",
        "evaluation/config.py:SensitivityConfig",
        "train/config.py:TrainConfig",
    },
    "estimators": {
        "evaluation/config.py:EvaluateConfig",
        "evaluation/config.py:SensitivityConfig",
    },
    "repeats": {
        "evaluation/config.py:EvaluateConfig",
        "evaluation/config.py:SensitivityConfig",
    },
    "group_size": {"evaluation/config.py:EvaluateConfig", "train/config.py:TrainConfig"},
    "rollouts_per_step": {"evaluation/config.py:EvaluateConfig", "train/config.py:TrainConfig"},
    "ref_n": {"rollouts/simulation.py:SimulationConfig", "train/config.py:TrainConfig"},
    # BASIS's eps swept by sensitivity; JamesStein's eps is another thing (estimators/, being
    # rewritten elsewhere: BasisOptions/JamesSteinOptions and TableOptions/SpoOptions wait)
    "eps": {
        "evaluation/config.py:SensitivityConfig",
        "estimators/options.py:BasisOptions",
        "estimators/options.py:JamesSteinOptions",
    },
    "prior": {"estimators/options.py:TableOptions", "estimators/options.py:SpoOptions"},
}


def _called(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _trees() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def declarations() -> dict[str, set[str]]:
    """Every ``setting()`` field name -> the classes (``file:Class``) that declare it."""
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in _trees():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and isinstance(stmt.value, ast.Call)
                    and _called(stmt.value.func) == "setting"
                ):
                    found[stmt.target.id].add(f"{path}:{cls.name}")
    return found


def test_no_setting_is_declared_in_two_classes_with_one_meaning():
    twice = {name: owners for name, owners in declarations().items() if len(owners) > 1}
    unreviewed = {
        name: sorted(owners)
        for name, owners in twice.items()
        if owners != ALLOWED.get(name) and owners != NOT_YET_ONE.get(name)
    }
    assert not unreviewed, (
        f"settings declared in two classes: {unreviewed}; declare it once (a section both "
        "hold, basis_bench.settings.section) or, if the names mean different things, add "
        "it to ALLOWED with why"
    )
    merged = sorted(set(NOT_YET_ONE) - set(twice))
    assert not merged, f"{merged} are declared once now: take them off NOT_YET_ONE"


def test_what_training_and_the_oracle_share_is_declared_once():
    shared = {
        "model", "backend", "device", "dtype", "instruction", "system_prompt",
        "max_new_tokens", "temperature", "top_p", "kv_cache_gib",
        "answer_format", "verify_timeout", "reward_workers",
    }  # fmt: skip
    found = declarations()
    for name in shared | {"prompts", "limit", "levels", "max_model_len"}:
        assert len(found[name]) == 1, (name, found[name])
    assert {next(iter(found[n])) for n in shared} == {
        "rollouts/generation.py:Generation",
        "rollouts/grading.py:Grading",
    }
    # both commands still offer them by the keys their users know (no renames): training
    # gives a few of the sections' settings the names its users have always used
    for name in shared:
        assert name in flat_keys(TrainConfig) and name in flat_keys(OracleJob), name
    theirs = {
        "sample_batch_size": "batch_size",
        "vllm_max_model_len": "max_model_len",
        "vllm_gpu_memory_utilization": "gpu_memory_utilization",
        "train_prompts": "prompts",
        "train_limit": "limit",
    }
    assert {k: flat_keys(TrainConfig)[k].field for k in theirs} == theirs
    assert {"batch_size", "prompts", "limit", "levels"} <= set(flat_keys(OracleJob))


def test_no_call_builds_a_settings_object_from_more_than_8_arguments():
    """A settings object with many inputs is built from its sections, passed whole."""
    classes = {
        cls.name
        for _, tree in _trees()
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        and (
            cls.name.endswith(("Settings", "Config", "Options", "Job", "Plan", "Schedule"))
            or any(
                isinstance(s, ast.AnnAssign)
                and isinstance(s.value, ast.Call)
                and _called(s.value.func) in ("setting", "section")
                for s in cls.body
            )
        )
    }
    big = set()
    sources = [(p, t) for p, t in _trees()] + [
        (path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for folder in ("experiments", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
    ]
    for path, tree in sources:
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
            name = _called(call.func)
            if name in classes and len(call.args) + len(call.keywords) > 8:
                big.add((path, name))
    assert not big, sorted(big)


# ------------------------------------------------- the defaults that had drifted (changelog)


def test_the_drifted_defaults_are_one_now():
    """answer_format: auto for both (training said any); system_prompt: "" (the chat
    template's own) for both (the oracle said None, which TOML cannot write); kv_cache_gib and
    the prompts' limit: 0 for "not set" (the oracle said None); temperature: the section
    allows 0 (greedy, one sample per prompt) and training refuses below 1e-5."""
    import pytest

    from basis_bench.errors import InputError

    for cls in (TrainConfig, OracleJob):
        assert setting_default(cls, "answer_format") == "auto"
        assert setting_default(cls, "system_prompt") == ""
        assert setting_default(cls, "kv_cache_gib") == 0.0  # 0: the engine's own
    assert setting_default(OracleJob, "limit") == setting_default(TrainConfig, "train_limit") == 0
    assert Grading().reward("arithmetic:n=4").answer_format == "number"
    assert Grading().reward("data/math.jsonl").answer_format == "any"
    assert Generation(model="m").template("arithmetic:n=4").system is None  # "": the template's
    assert make_config({}).grading.reward(make_config({}).train.prompts).answer_format == "number"
    with pytest.raises(InputError, match="at least 1e-05 in training"):
        make_config({}, ["temperature=0"])
    greedy = Generation(model="m", temperature=0.0).sampling(1, "arithmetic:n=4")
    assert greedy.temperature == 0.0 and greedy.max_new_tokens == 48
