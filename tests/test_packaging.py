"""The wheel carries the default dataset, so `pip install basis-bench` runs the main job."""

import subprocess
import sys
import zipfile
from pathlib import Path

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
