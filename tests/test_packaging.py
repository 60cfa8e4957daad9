"""The wheel carries the default dataset, so `pip install basis-bench` runs the main job, and
its licence; the citation file names the version that is installed."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

import basis_bench
from basis_bench.rollouts.store import default_dataset, rollout_files

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_the_default_dataset(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("basis_bench-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in rollout_files(default_dataset())} | {
        "basis_bench/data/default/prompts.parquet"
    }
    assert shipped <= names, sorted(shipped - names)
    # the licence travels with the wheel, and its metadata says which one it is
    (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    archive = zipfile.ZipFile(wheel)
    assert archive.read(licence) == (ROOT / "LICENSE").read_bytes()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert "License-Expression: MIT" in archive.read(metadata).decode()


def test_the_citation_file_names_this_version_the_licence_and_the_paper():
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    for key in ("cff-version", "message", "title", "authors"):  # CFF 1.2's required keys
        assert citation[key], key
    assert str(citation["version"]) == basis_bench.__version__
    assert citation["license"] == "MIT" and (ROOT / "LICENSE").read_text().startswith("MIT License")
    (paper,) = citation["references"]
    assert paper["title"].startswith("BASIS: Batchwise Advantage Estimation")
    assert paper["authors"]


def test_version_flag_prints_the_projects_version():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = subprocess.run(
        [sys.executable, "-m", "basis_bench", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0 and shown.stdout == f"basis-bench {version}\n"


NO_HF = """
import sys


class NoHf:
    # an environment where the [hf] extra was never installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"torch", "transformers", "accelerate", "gguf"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])


sys.meta_path.insert(0, NoHf())
from basis_bench.cli import main

main()
"""


def test_oracle_without_the_hf_extra_is_one_line_naming_it(tmp_path):
    """The README's oracle line without the [hf] extra was a 40-line traceback ending in
    ``No module named 'torch'``; the main job needs no torch and still runs."""
    oracle = [sys.executable, "-c", NO_HF, "oracle", "--model", "smollm2-135m", "--policy", "p",
              "--prompts", "arithmetic:n=4", "--n", "2", "--out", str(tmp_path / "o")]  # fmt: skip
    done = subprocess.run(oracle, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: this command needs 'torch', which the [hf] extra installs: "
        "pip install 'basis-bench[hf]' (in a clone: pip install -e '.[hf]')"
    ]
    assert not (tmp_path / "o").exists()
    evaluate = [sys.executable, "-c", NO_HF, "evaluate", "--estimators", "basis,grpo",
                "--repeats", "3", "--no-trajectory", "--out", str(tmp_path / "r")]  # fmt: skip
    done = subprocess.run(evaluate, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / "summary.csv").is_file()


def test_each_extra_named_in_a_hint_installs_its_module():
    """The hint's extra is the one in pyproject.toml that lists the module's package."""
    import tomllib

    from basis_bench.guards.extras import EXTRA_OF

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for module, extra in EXTRA_OF.items():
        names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0] for req in extras[extra]}
        assert module in names, (module, extra, names)
