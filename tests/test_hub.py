"""Hub names as vLLM, TRL and lm-eval take them: `--model org/name` and `--prompts
hf:org/name` resolve from a prepared local Hugging Face cache with the Hub off
(HF_HUB_OFFLINE=1, no network), in a fresh `basis-bench` process as a user runs it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import CLI, ONE_THREAD, assert_one_line_error, needs_extra

from basis_bench.guards.outputs import read_metadata
from basis_bench.rollouts.prompts import load_prompt_source
from basis_bench.rollouts.store import load_prompts, load_rollouts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "math_sample.jsonl"


def cache_repo(hub: Path, kind: str, name: str, files: dict[str, Path]) -> None:
    """``name`` in the Hub cache's layout: KINDs--org--name/snapshots/REV/..., refs/main."""
    repo = hub / f"{kind}s--{name.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    for target, source in files.items():
        (repo / "snapshots" / revision / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, repo / "snapshots" / revision / target)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)


@pytest.fixture(scope="module")
def hf_home(tiny_model, tmp_path_factory) -> Path:
    """An HF_HOME holding the tiny Llama as acme/tiny-llama and the MATH sample as the
    test split of the dataset acme/math-sample."""
    home = tmp_path_factory.mktemp("hf-home")
    model_files = {p.name: p for p in tiny_model.iterdir()}
    cache_repo(home / "hub", "model", "acme/tiny-llama", model_files)
    cache_repo(home / "hub", "dataset", "acme/math-sample", {"data/test.jsonl": SAMPLE})
    return home


def basis_bench(hf_home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**ONE_THREAD, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env=env)


def oracle_args(ckpt: str, prompts: str, out: Path) -> list[str]:
    return [
        "oracle", "--model", ckpt, "--policy", "tiny", "--prompts", prompts, "--limit", "3",
        "--n", "2", "--max-new-tokens", "8", "--device", "cpu", "--out", str(out),
    ]  # fmt: skip


@needs_extra("datasets")
def test_hub_names_of_a_model_and_a_dataset_resolve_from_the_local_cache(hf_home, tmp_path):
    out = tmp_path / "o"
    done = basis_bench(hf_home, *oracle_args("acme/tiny-llama", "hf:acme/math-sample@test", out))
    assert done.returncode == 0, done.stderr
    expected = load_prompt_source(str(SAMPLE), limit=3)
    prompts = load_prompts(out).sort("prompt_id")
    assert prompts["prompt_id"].to_list() == sorted(expected["prompt_id"])
    assert prompts.join(expected, on="prompt_id")["answer"].equals(
        prompts.join(expected, on="prompt_id")["answer_right"]
    )
    assert load_rollouts(out, ["tiny"]).height == 6
    (part,) = (out / "rollouts" / "tiny").glob("part-*.parquet")
    assert read_metadata(part)["run"]["model"]["name"] == "acme/tiny-llama"


@pytest.mark.parametrize(
    ("ckpt", "prompts", "download"),
    [
        ("acme/absent-model", "arithmetic:n=3", "hf download acme/absent-model"),
        pytest.param(
            "acme/tiny-llama",
            "hf:acme/absent-data",
            "hf download acme/absent-data --repo-type dataset",
            marks=needs_extra("datasets"),
        ),
    ],
)
def test_a_hub_name_not_in_the_cache_is_one_line_naming_the_download(
    hf_home, tmp_path, ckpt, prompts, download
):
    done = basis_bench(hf_home, *oracle_args(ckpt, prompts, tmp_path / "o"))
    assert_one_line_error(done, "not in the local Hugging Face cache", "HF_HUB_OFFLINE", download)
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- issue 44, class 6

BAD_MODELS = ["a/b--c", "a/-b", "a/b.", "a/" + "b" * 97, "a/b.git"]


@pytest.mark.parametrize("name", BAD_MODELS)
def test_a_model_name_the_hub_library_refuses_is_one_line(monkeypatch, name):
    """a/b--c, a/-b, a/b. and names over 96 characters passed our rule and raised
    huggingface_hub's HFValidationError, a traceback."""
    from basis_bench.errors import InputError
    from basis_bench.rollouts.hub import hub_snapshot, is_hub_name
    from basis_bench.rollouts.models import resolve_checkpoint

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert not is_hub_name(name)
    with pytest.raises(InputError, match="not a Hub name"):
        resolve_checkpoint(name)
    with pytest.raises(InputError, match="not a Hugging Face Hub name"):
        hub_snapshot(name, "model", f"--model {name}")


@pytest.mark.parametrize("spec", ["hf:../../etc", "hf:", "hf:/etc", "hf:a/b--c", "hf:a/b/c"])
def test_a_hub_dataset_name_is_checked_before_use(monkeypatch, spec):
    """--prompts hf:NAME was never checked: hf:../../etc, hf:, hf:/etc."""
    from basis_bench.errors import InputError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError, match=r"not a Hugging Face dataset name"):
        load_prompt_source(spec)


def test_good_hub_names_pass_both_rules():
    from basis_bench.rollouts.hub import hub_name_problem

    for name in (
        "acme/tiny-llama",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "a/b_c.d",
        "a/" + "b" * 96,
    ):
        assert hub_name_problem(name) is None, name
    assert hub_name_problem("gsm8k", org=False) is None
    assert hub_name_problem("gsm8k") == "a Hub name is org/name"
