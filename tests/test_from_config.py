"""Options made from a config class (basis_bench.cli.from_config): a field's help, default,
range, choices and old names reach the command line, and the config enforces them."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from basis_bench.cli.from_config import options_from
from basis_bench.errors import InputError
from basis_bench.evaluation.config import SensitivityConfig
from basis_bench.settings import (
    RenamedSetting,
    check_settings,
    renamed_keys,
    setting,
    setting_flag,
)


@dataclass(frozen=True)
class Toy:
    size: int = setting(4, min_val=1, help="How many, at least one.", was=("count",))
    mode: str = setting("a", choices=("a", "b"), help="Which mode.")
    names: tuple[str, ...] = setting((), flag="--name", help="A name; repeat.")

    def __post_init__(self) -> None:
        check_settings(self, lambda name: setting_flag(Toy, name))


toy = typer.Typer()


@toy.command()
@options_from(Toy)
def show(config: Toy, out: Annotated[str, typer.Option("--out", help="Where to.")] = "x") -> None:
    """Print the config."""
    typer.echo(f"{config!r} {out}")


def invoke(*args: str) -> str:
    result = CliRunner().invoke(toy, list(args), env={"COLUMNS": "200"})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.output


def test_help_shows_each_fields_help_and_default_and_hides_old_names() -> None:
    text = invoke("--help")
    for needle in ("--size", "How many, at least one.", "[default: 4]", "Which mode.", "--name"):
        assert needle in text
    assert "--out" in text and "--count" not in text


def test_values_reach_the_config_and_the_command_keeps_its_extras() -> None:
    got = invoke("--size", "7", "--mode", "b", "--name", "x", "--name", "y", "--out", "o")
    assert got.strip() == "Toy(size=7, mode='b', names=('x', 'y')) o"
    assert invoke().strip() == "Toy(size=4, mode='a', names=()) x"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--size", "0"), "--size must be >= 1; got 0"),
        (("--mode", "c"), "--mode must be one of a, b; got 'c'"),
        (("--count", "3", "--size", "5"), "--count and --size are the same setting; give --size"),
    ],
)
@pytest.mark.filterwarnings("ignore::basis_bench.settings.RenamedSetting")
def test_the_config_enforces_range_and_choices_naming_the_flag(args, message) -> None:
    with pytest.raises(InputError, match=message):
        invoke(*args)


def test_an_old_flag_still_works_with_a_notice() -> None:
    with pytest.warns(RenamedSetting, match="--count is renamed --size"):
        assert invoke("--count", "3").startswith("Toy(size=3,")


def test_an_old_key_still_works_with_a_notice() -> None:
    with pytest.warns(RenamedSetting, match="count is renamed size"):
        assert renamed_keys(Toy, {"count": 3, "mode": "b"}) == {"size": 3, "mode": "b"}
    with pytest.raises(InputError, match="count and size are the same setting"):
        renamed_keys(Toy, {"count": 3, "size": 3})


def test_basis_flags_come_from_basis_options() -> None:
    from basis_bench.cli import app

    text = CliRunner().invoke(app, ["evaluate", "--help"], env={"COLUMNS": "300"}).output
    assert (
        "Active-set threshold of BASIS's refinement: sources with s^2 > eps. Default: the " in text
    )
    result = CliRunner().invoke(app, ["evaluate", "--loss", "cubic"])
    assert isinstance(result.exception, InputError)
    assert "basis.loss must be one of squared, log; got 'cubic'" in str(result.exception)


def test_simulate_takes_the_old_reference_n_and_writes_the_same_dataset(
    monkeypatch, capsys, tmp_path
) -> None:
    from basis_bench.cli import main

    def run(out: Path, flag: str) -> str:
        args = ["simulate", "--out", str(out), "--prompts", "6", flag, "3", "--checkpoint-n", "4"]
        monkeypatch.setattr(sys, "argv", ["basis-bench", *args])
        with pytest.raises(SystemExit) as stop:
            main()
        assert stop.value.code in (0, None)
        return capsys.readouterr().err

    assert run(tmp_path / "new", "--ref-n") == ""
    notice = run(tmp_path / "old", "--reference-n")
    assert notice.strip().splitlines() == [
        "warning: --reference-n is renamed --ref-n; the old name is removed in basis-bench 0.2.0"
    ]
    files = sorted(p.relative_to(tmp_path / "new") for p in (tmp_path / "new").rglob("*"))
    assert files == sorted(p.relative_to(tmp_path / "old") for p in (tmp_path / "old").rglob("*"))
    for name in files:
        if (tmp_path / "new" / name).is_file():
            assert (tmp_path / "new" / name).read_bytes() == (tmp_path / "old" / name).read_bytes()


def test_the_sensitivity_knob_n_is_ref_n() -> None:
    with pytest.warns(RenamedSetting, match="--parameters n is renamed --parameters ref_n"):
        assert SensitivityConfig(parameters=("eps", "n")).parameters == ("eps", "ref_n")


def test_oracle_takes_its_old_flags_the_required_one_included(monkeypatch, capsys, tmp_path):
    """--ckpt (required under its new name --model), --system, --score-workers and
    --features reach the job: one notice each, then the job runs (here: to the missing
    model, named by its new flag)."""
    from basis_bench.cli import main

    args = ["oracle", "--ckpt", str(tmp_path / "none"), "--policy", "p", "--prompts",
            "arithmetic:n=2", "--out", str(tmp_path / "o"), "--system", "S",
            "--score-workers", "1", "--features", "hidden"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["basis-bench", *args])
    with pytest.raises(SystemExit) as stop:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2
    assert [line.split(";")[0] for line in lines[:-1]] == [
        "warning: --ckpt is renamed --model",
        "warning: --system is renamed --system-prompt",
        "warning: --score-workers is renamed --reward-workers",
        "warning: --features is renamed --store-features",
    ]
    assert lines[-1].startswith(f"error: --model '{tmp_path / 'none'}': no such model")


def test_the_python_api_takes_an_old_argument_name_with_a_notice(tmp_path) -> None:
    import basis_bench

    with pytest.warns(RenamedSetting, match="reference_n is renamed ref_n"):
        old = basis_bench.simulate(tmp_path / "old", n_prompts=6, reference_n=3, checkpoint_n=4)
    new = basis_bench.simulate(tmp_path / "new", n_prompts=6, ref_n=3, checkpoint_n=4)
    for name in ("rollouts/reference.parquet", "prompts.parquet"):
        assert (old / name).read_bytes() == (new / name).read_bytes()
