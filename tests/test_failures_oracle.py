"""``basis-bench oracle``'s failures (issue 14): options, prompt files and checkpoints
are refused before anything is written; a model that cannot load, a read-only folder or a
full disk leave the out folder as it was (completed parts stay valid).

No case loads a real model (a fake sampler, or a tiny Llama that fails to load).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
from typing import Any

import numpy as np
import pytest
from conftest import assert_one_line_error, mounted_tmpfs, oracle_args, run_main, snapshot

from basis_bench.guards.outputs import claim_output_dir, read_output_marker, write_parquet_atomic
from basis_bench.rollouts.store import load_rollouts

# --------------------------------------------------------------------------- oracle


class FakeSampler:
    """Answers every prompt with a long fixed text: parts are big, no model is loaded."""

    def __init__(self, text: str = "x" * 2000) -> None:
        self.text = text

    def sample(self, problems, config, seed, on_progress=None):
        from basis_bench.rollouts.sampling.base import Samples

        count = len(problems) * config.n
        rng = np.random.default_rng(seed)
        texts = [self.text + rng.bytes(3000).hex() for _ in range(count)]
        return Samples(texts, np.full(count, 7, dtype=np.int32), ["length"] * count)

    def describe(self) -> dict[str, Any]:
        return {"backend": "fake"}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        # the wording of settings.check_scalar, the one range checker
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1"),
        (["--temperature", "nan"], "--temperature must be a number, not NaN"),
        (["--temperature", "inf"], "--temperature must be finite"),
        (["--verify-timeout", "nan"], "--verify-timeout must be a number, not NaN"),
        (["--verify-timeout", "inf"], "--verify-timeout must be finite"),
        (["--top-p", "nan"], "--top-p must be a number, not NaN"),
    ],
)
def test_oracle_options_are_refused_before_anything_is_written(
    monkeypatch, capsys, fake_ckpt, tmp_path, extra, needle
):
    out = tmp_path / "out"
    assert_one_line_error(
        run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, out, *extra)), needle
    )
    assert not out.exists()


def test_oracle_refuses_a_non_utf8_prompt_file(monkeypatch, capsys, fake_ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(
        b'{"problem": "1+1", "answer": "2"}\n{"problem": "\xff\xfe", "answer": "1"}\n'
    )
    args = oracle_args(fake_ckpt, tmp_path / "out")
    args[args.index("--prompts") + 1] = str(prompts)
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "p.jsonl:2", "not UTF-8")


@pytest.mark.parametrize("broken", ["config.json", "model.safetensors", "fake.gguf"])
def test_oracle_names_a_corrupt_checkpoint(monkeypatch, capsys, tmp_path, broken):
    from transformers import LlamaConfig

    ckpt = tmp_path / "ckpt"
    LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    ).save_pretrained(ckpt)  # fmt: skip
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    target = ckpt
    if broken == "config.json":
        (ckpt / "config.json").write_text("{garbage")
    elif broken == "fake.gguf":
        target = tmp_path / "fake.gguf"
        target.write_text("not a gguf file")
    out = tmp_path / "out"
    result = run_main(monkeypatch, capsys, *oracle_args(target, out))
    assert_one_line_error(result, str(target.resolve()), "cannot load the model", "corrupt")


# A Llama small enough to build (the defaults make 6.5B parameters, refused before building).
TINY_LLAMA = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2}  # fmt: skip


def test_an_oracle_whose_model_cannot_load_writes_nothing(
    monkeypatch, capsys, tmp_path, real_dataset
):
    """The model loads before prompts.parquet is merged: a corrupt checkpoint leaves the
    dataset's bytes as they were."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(TINY_LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    claim_output_dir(real_dataset, "rollouts", simulated=False)  # as an earlier run left it
    before = snapshot(real_dataset)
    assert "prompts.parquet" in before
    result = run_main(monkeypatch, capsys, *oracle_args(ckpt, real_dataset))
    assert_one_line_error(result, "cannot load the model")
    assert snapshot(real_dataset) == before


# with 2 workers the model loads in spawned processes (about 15 s on the shared machine)
@pytest.mark.parametrize(("workers", "given"), [("1", "empty"), ("2", "new")])
def test_an_oracle_whose_model_cannot_load_leaves_the_out_folder_as_it_was(
    monkeypatch, capsys, tmp_path, workers, given
):
    """The claim (marker, lock file) and, with workers, prompts.parquet were written before
    the model loaded: a failed start left a claimed folder. Now a new --out is removed again
    and an empty one stays empty (its own subfolder kept)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(TINY_LLAMA))
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    out = tmp_path / "out"
    if given == "empty":
        (out / "mine").mkdir(parents=True)
    args = oracle_args(ckpt, out)
    args[args.index("--workers") + 1] = workers
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "cannot load the model")
    assert (
        sorted(p.name for p in out.iterdir()) == ["mine"] if given == "empty" else not out.exists()
    )
    fresh = claim_output_dir(out, "rollouts", simulated=False)  # and the next claim is clean
    assert read_output_marker(fresh)["kind"] == "rollouts"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_oracle_without_torch_is_one_line_before_any_worker_starts(
    monkeypatch, capsys, fake_ckpt, tmp_path, workers
):
    """Without the [hf] extra, --workers 2 spawned processes that died on the import: the
    parent's "oracle worker oracle-0 died" traceback. Now one line names the install."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as if absent
    out = tmp_path / "out"
    args = oracle_args(fake_ckpt, out)
    args[args.index("--workers") + 1] = workers
    result = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(result, "needs 'torch'", "pip install 'basis-bench[hf]'")
    assert not out.exists()


def test_oracle_refuses_a_simulated_dataset(monkeypatch, capsys, fake_ckpt, sim_dataset):
    before = snapshot(sim_dataset)
    result = run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, sim_dataset))
    assert_one_line_error(result, "simulated rollouts", "would mix")
    assert snapshot(sim_dataset) == before


def test_oracle_on_a_read_only_out_is_one_line(monkeypatch, capsys, fake_ckpt, tmp_path):
    ro = tmp_path / "ro"
    with mounted_tmpfs(ro, "ro,size=64k") as mounted:
        if not mounted:
            if os.geteuid() == 0:
                pytest.skip("cannot mount a read-only tmpfs, and root ignores file modes")
            ro.chmod(0o555)
        result = run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, ro / "out"))
        with contextlib.suppress(OSError):
            ro.chmod(0o755)
    assert not ro.is_mount()
    assert_one_line_error(result, "ro/out", "rerun the same command to resume", code=1)
    assert ("read-only" in result[1]) or ("permission denied" in result[1])


def test_oracle_disk_full_keeps_completed_parts_valid(monkeypatch, capsys, fake_ckpt, tmp_path):
    """Disk full mid-run: one line, exit 1, every part on disk loads, no temporary file is
    left, and a rerun with space resumes and completes the dataset."""
    import basis_bench.rollouts.oracle_chunks as oracle_module
    import basis_bench.rollouts.sampling as sampling

    monkeypatch.setattr(sampling, "make_sampler", lambda *a, **k: FakeSampler())
    disk = tmp_path / "disk"
    with mounted_tmpfs(disk, "size=160k") as mounted:
        if not mounted:  # no tmpfs here: the writer fails as a full disk would, after part 6
            real, calls = oracle_module.write_parquet_atomic, []

            def full_after_six(df, path, metadata=None):
                calls.append(path)
                if len(calls) > 6:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
                return real(df, path, metadata)

            monkeypatch.setattr(oracle_module, "write_parquet_atomic", full_after_six)
        out = disk / "out"
        result = run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, out))
        assert_one_line_error(result, "no space left", "completed parts are kept", code=1)
        parts = sorted((out / "rollouts" / "p").glob("part-*.parquet"))
        assert 0 < len(parts) < 40
        assert load_rollouts(out)["prompt_id"].n_unique() == len(parts)
        assert not [f for f in out.rglob("*") if f.name.endswith((".tmp", ".staged"))]
        kept = snapshot(out / "rollouts")
        shutil.copytree(out, tmp_path / "out")
    assert not disk.is_mount()
    monkeypatch.setattr(oracle_module, "write_parquet_atomic", write_parquet_atomic)
    assert run_main(monkeypatch, capsys, *oracle_args(fake_ckpt, tmp_path / "out"))[0] == 0
    assert load_rollouts(tmp_path / "out")["prompt_id"].n_unique() == 40
    after = snapshot(tmp_path / "out" / "rollouts")
    assert {k: after[k] for k in kept} == kept  # the completed parts were not rewritten


# --------------------------------------------------------------------------- the hunt (issue 22)
# Hostile inputs tried on every command beyond the examples; each case here once
# wrote something, changed a value or left a traceback.


@pytest.mark.parametrize("policy", ["ck\n", "p" * 201])
def test_a_policy_name_is_checked_whole_before_anything_is_written(
    monkeypatch, capsys, fake_ckpt, tmp_path, policy
):
    """``ck\\n`` passed the name check (``$`` matches before a final newline) and named a
    folder with a newline; 300 letters were a traceback (file name too long)."""
    source = tmp_path / "c.csv"
    source.write_text("prompt_id,n,n_correct\na,4,1\n")
    out = tmp_path / "out"
    result = run_main(
        monkeypatch, capsys, "import", "counts", str(source), "--policy", policy, "--out", str(out)
    )
    assert_one_line_error(result, "--policy", "use 1-200 letters")
    args = oracle_args(fake_ckpt, out)
    args[args.index("--policy") + 1] = policy
    assert_one_line_error(run_main(monkeypatch, capsys, *args), "--policy", "use 1-200 letters")
    assert not out.exists()
