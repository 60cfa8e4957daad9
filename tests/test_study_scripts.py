"""The study scripts (issue 44, class 9): collect.sh reads each run through the package's
readers (a bad config.json or log.jsonl is one line and exit 2, not a traceback, a skipped
seed and exit 0) and takes its paths from where it is run; run.sh finds an inherited
run_dir; folder names reach training_table.md escaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_main

ROOT = Path(__file__).resolve().parents[1]
COLLECT = ROOT / "experiments" / "study" / "collect.sh"


def _env() -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _run(path: Path, seed: int = 0, steps: int = 2) -> Path:
    path.mkdir(parents=True)
    config = {"estimator": "grpo", "group_size": 4, "loss": "grpo", "seed": seed, "steps": steps}
    (path / "config.json").write_text(json.dumps(config))
    lines = [{"step": 0, "eval_accuracy": 0.1}] + [
        {"step": t, "mean_reward": 0.1 * t, "eval_accuracy": 0.2} for t in range(1, steps + 1)
    ]
    (path / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


@pytest.mark.parametrize(
    ("name", "text"), [("config.json", "{not json"), ("log.jsonl", '{"step": 1}\nnot a record\n')]
)
def test_collect_stops_in_one_line_on_a_broken_run(tmp_path, name, text):
    """It printed a traceback, skipped that seed and exited 0."""
    src = tmp_path / "runs"
    _run(src / "grpo" / "seed-0")
    run = _run(src / "grpo" / "seed-1", seed=1)
    (run / name).write_text(text)
    done = subprocess.run(
        ["bash", str(COLLECT), "runs", "logs"], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("collect.sh: error:") and name in done.stderr
    # nothing copied: seed-0's logs were copied before seed-1 stopped it, beside old figures
    assert not (tmp_path / "logs").exists()


def test_collect_takes_relative_paths_from_where_it_runs(tmp_path):
    """It resolved them against the repository root it changes into."""
    _run(tmp_path / "runs" / "grpo" / "seed-0")
    done = subprocess.run(
        ["bash", str(COLLECT), "runs", "logs"], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "logs" / "grpo" / "seed-0" / "log.jsonl").is_file()
    assert (tmp_path / "logs" / "figures" / "training_table.md").is_file()
    assert not (ROOT / "logs").exists()


def test_folder_names_reach_the_table_escaped(monkeypatch, capsys, tmp_path):
    """An ESC byte in a folder name reached training_table.md raw; a | split its row."""
    a = _run(tmp_path / "x|y" / "run")
    b = _run(tmp_path / "z\x1b[31m" / "run")
    out = tmp_path / "figs"
    result = run_main(monkeypatch, capsys, "train-figures", str(a), str(b), "--out", str(out))
    assert result.code == 0, result.message
    table = (out / "training_table.md").read_text()
    assert "\x1b" not in table and "x\\|y/run" in table and "\\x1b" in table
    rows = [line for line in table.splitlines() if "run)" in line]
    assert len(rows) == 2 and len({row.count(" | ") for row in rows}) == 1


def test_run_sh_resolves_an_inherited_run_dir():
    """run.sh read run_dir with sed: a config that inherits it (extends) gave ""."""
    text = (ROOT / "experiments" / "study" / "run.sh").read_text()
    assert "make_config(read_config_file" in text and "sed -n 's/^run_dir" not in text


STRICT = ROOT / "experiments" / "study" / "strict"


@pytest.mark.parametrize("arm", ["vanilla", "basis", "vanilla_lr1e-4", "basis_lr1e-4"])
def test_the_strict_pilot_is_the_study_with_only_the_task_changed(arm):
    """Issue 42 item 4: each pilot arm is the study's arm of that name with the strict grader,
    room to answer (48-64 tokens), no value probe and its own run folder; nothing else."""
    from basis_bench.train import make_config
    from basis_bench.train.config import config_dict, read_config_file

    def settings(path: Path) -> dict:
        return config_dict(make_config(read_config_file(path)))

    study, strict = (
        settings(ROOT / "experiments" / "study" / f"{arm}.toml"),
        settings(STRICT / f"{arm}.toml"),
    )
    changed = {k for k in study.keys() | strict.keys() if study.get(k) != strict.get(k)}
    assert changed <= {"answer_format", "max_new_tokens", "probe_every", "run_dir"}, changed
    config = make_config(read_config_file(STRICT / f"{arm}.toml"))
    assert config.grading.answer_format == "final_line"
    assert 48 <= config.generation.max_new_tokens <= 64
    assert config.run_dir == f"runs/study-strict/{arm}"
    # the pilot's runner names these arms by default
    assert arm in (STRICT / "run.sh").read_text().split("ARMS:-")[1].split("}")[0].split()
