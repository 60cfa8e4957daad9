"""Each setting is declared once: read from the source, so a second declaration fails here
before anyone has to notice two help texts or two defaults drifting apart (issue 43).

A setting is a ``setting()`` field of a class; a field made by a factory that returns a
``setting()`` (``_seed()``, ``ref_n_setting()``) is declared in that factory, once for every
class that calls it. A name declared in two places is allowed only where it means different
things there (ALLOWED, reviewed: the places are listed, so a third declaration is reviewed
again). Shared concerns are sections (:func:`basis_bench.settings.section`): Generation and
Grading are held whole by the oracle's job and training's config; single settings that
several configs share are one factory each (estimators/options.py: n, G, R, eps, prior,
grid size).
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
        "evaluation/config.py:_seed",  # evaluate's and sensitivity's
        "rollouts/importers/options.py:ImportOptions",
        "rollouts/oracle_job.py:OracleJob",
        "rollouts/simulation.py:SimulationConfig",
        "train/config.py:TrainConfig",
    },
    "batch_size": {  # sequences decoded together / prompts per batch draw B
        "evaluation/config.py:_batch_size",  # evaluate's and sensitivity's
        "rollouts/generation.py:Generation",
    },
    # the estimators evaluate compares (default all) / the single-rollout ones sensitivity
    # sweeps (default basis, 'all' refused)
    "estimators": {
        "evaluation/config.py:EvaluateConfig",
        "evaluation/config.py:SensitivityConfig",
    },
    "repeats": {  # batch draws per checkpoint (1000) / per knob value and checkpoint (200)
        "evaluation/config.py:EvaluateConfig",
        "evaluation/config.py:SensitivityConfig",
    },
    # {estimator: {key: value}}, for each estimator evaluate or sensitivity runs / the one
    # estimator training uses, {key: value}
    "estimator_options": {
        "evaluation/config.py:_estimator_options",
        "train/config.py:TrainConfig",
    },
    "eps": {  # BASIS's active-set threshold (sensitivity's too) / James-Stein's weight's epsilon
        "estimators/options.py:eps_setting",
        "estimators/options.py:JamesSteinOptions",
    },
    "loss": {  # the policy loss / BASIS's calibration loss
        "train/config.py:TrainConfig",
        "estimators/options.py:BasisOptions",
        "estimators/memory.py:MemoryOptions",
    },
}


def _called(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")


def _trees() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def _factories(trees: list[tuple[str, ast.Module]]) -> dict[str, dict[str, str]]:
    """The declaration factories: module-level functions that return a ``setting(...)``
    (``_seed()``, ``ref_n_setting()``), by name -> {file: ``file:function``}. A field made by
    one is declared there, once, however many classes hold it."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for path, tree in trees:
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef) and any(
                isinstance(node, ast.Return)
                and isinstance(node.value, ast.Call)
                and _called(node.value.func) == "setting"
                for node in ast.walk(fn)
            ):
                found[fn.name][path] = f"{path}:{fn.name}"
    return found


def _where(call: ast.Call, path: str, factories: dict[str, dict[str, str]]) -> str | None:
    """Where the field made by ``call`` (in ``path``) is declared: None if it is no setting."""
    name = _called(call.func)
    if name not in factories:
        return None
    places = factories[name]
    if path in places:  # the file's own factory, else the one imported
        return places[path]
    assert len(places) == 1, f"{path}: which {name}? {sorted(places.values())}"
    return next(iter(places.values()))


def declarations(trees: list[tuple[str, ast.Module]] | None = None) -> dict[str, set[str]]:
    """Every ``setting()`` field name -> where it is declared: the class (``file:Class``)
    that calls ``setting()`` for it, or the factory (``file:function``) it calls."""
    trees = _trees() if trees is None else trees
    factories = _factories(trees)
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees:
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                if not (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and isinstance(stmt.value, ast.Call)
                ):
                    continue
                if _called(stmt.value.func) == "setting":
                    found[stmt.target.id].add(f"{path}:{cls.name}")
                elif (where := _where(stmt.value, path, factories)) is not None:
                    found[stmt.target.id].add(where)
    return found


def unreviewed(found: dict[str, set[str]]) -> dict[str, list[str]]:
    """The names declared in two places that ALLOWED does not list with exactly those."""
    return {
        name: sorted(owners)
        for name, owners in found.items()
        if len(owners) > 1 and owners != ALLOWED.get(name)
    }


def test_no_setting_is_declared_in_two_classes_with_one_meaning():
    found = declarations()
    twice = {name for name, owners in found.items() if len(owners) > 1}
    assert not unreviewed(found), (
        f"settings declared in two classes: {unreviewed(found)}; declare it once (a section "
        "both hold, basis_bench.settings.section, or one factory that returns the setting) or, "
        "if the names mean different things, add it to ALLOWED with why"
    )
    stale = sorted(set(ALLOWED) - twice)
    assert not stale, f"{stale} are declared once now: take them off ALLOWED"


PLANTED = """
from basis_bench.settings import setting

def _shared():
    return setting(1, help="declared once, held by A and B")

def _helper():
    return 1

class A:
    twice: int = setting(1, help="declared here")
    shared: int = _shared()
    again: int = _shared()
    plain: int = _helper()

class B:
    twice: int = setting(1, help="and here again")
    shared: int = _shared()
    plain: int = _helper()

class C:
    again: int = setting(1, help="a factory's setting declared beside it")
"""


def test_the_count_finds_a_planted_duplicate():
    found = declarations([("planted.py", ast.parse(PLANTED))])
    assert found == {
        "twice": {"planted.py:A", "planted.py:B"},
        "shared": {"planted.py:_shared"},
        "again": {"planted.py:_shared", "planted.py:C"},
    }
    assert set(unreviewed(found)) == {"twice", "again"}
    # a factory imported from another file is the same declaration
    other = ast.parse("from planted import _shared\nclass D:\n    shared: int = _shared()\n")
    both = declarations([("planted.py", ast.parse(PLANTED)), ("other.py", other)])
    assert both["shared"] == {"planted.py:_shared"}


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


def test_the_cache_size_has_one_range():
    """ref_n had drifted: the simulator refused more than 2**31 - 1 samples (a sample index
    is Int32), training and evaluate took any; one declaration, one range."""
    import pytest

    from basis_bench.errors import InputError
    from basis_bench.evaluation.config import EvaluateConfig, SensitivityConfig
    from basis_bench.rollouts.simulation import SimulationConfig

    for make in (EvaluateConfig, SensitivityConfig, SimulationConfig):
        with pytest.raises(InputError, match=r"--ref-n must be in \[1, 2147483647\]"):
            make(ref_n=2**31)
    with pytest.raises(InputError, match=r"ref_n must be in \[1, 2147483647\]"):
        make_config({}, [f"ref_n={2**31}"])
    assert make_config({}).ref_n == setting_default(SimulationConfig, "ref_n") == 64
