"""The sampler interface: call planning, the shared decode path, the hf backend on the
real SmolLM2 model, and the vllm backend wherever vllm imports."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from basis_bench.errors import InputError
from basis_bench.rollouts.models import load_tokenizer, resolve_checkpoint
from basis_bench.rollouts.prompts import DEFAULT_TEMPLATE
from basis_bench.rollouts.sampling import SamplingConfig, make_sampler
from basis_bench.rollouts.sampling.base import Sampler
from basis_bench.rollouts.sampling.hf import plan_calls


def _vllm_import_error() -> str | None:
    try:
        import vllm  # noqa: F401
    except Exception as err:  # ImportError, or a CUDA/driver error raised on import
        return f"{type(err).__name__}: {err}"
    return None


VLLM_ERROR = _vllm_import_error()
needs_vllm = pytest.mark.skipif(
    VLLM_ERROR is not None, reason=f"vllm does not import here ({VLLM_ERROR})"
)

PROBLEMS = [
    "What is 2 + 3?",
    "A train travels 60 km in 1.5 hours. What is its average speed in km/h?",
]


# --------------------------------------------------------------------------- planning


@pytest.mark.parametrize(
    ("n_prompts", "n", "batch_size"), [(5, 3, 7), (2, 8, 8), (3, 5, 2), (4, 1, 1), (1, 256, 64)]
)
def test_plan_calls_covers_every_sequence_in_prompt_major_order(n_prompts, n, batch_size):
    calls = plan_calls(n_prompts, n, batch_size)
    order = [p for prompts, reps in calls for p in prompts for _ in range(reps)]
    assert order == [p for p in range(n_prompts) for _ in range(n)]
    assert all(len(prompts) * reps <= batch_size for prompts, reps in calls)


def test_plan_calls_packs_prompts_when_n_is_small():
    assert plan_calls(5, 3, 7) == [(range(0, 2), 3), (range(2, 4), 3), (range(4, 5), 3)]
    assert plan_calls(1, 5, 2) == [(range(0, 1), 2), (range(0, 1), 2), (range(0, 1), 1)]


def test_sampling_config_validation():
    for bad in (
        {"n": 0},
        {"n": 2, "temperature": 0.0},
        {"n": 1, "temperature": -1.0},
        {"n": 1, "top_p": 0.0},
        {"n": 1, "top_p": 1.5},
        {"n": 1, "max_new_tokens": 0},
    ):
        with pytest.raises(InputError):
            SamplingConfig(**bad)
    assert SamplingConfig(n=1, temperature=0.0).temperature == 0.0


def test_make_sampler_rejects_bad_backend_settings():
    ckpt = resolve_checkpoint("smollm2-135m")
    with pytest.raises(InputError, match="--backend must be one of"):
        make_sampler("tgi", ckpt)
    with pytest.raises(InputError, match="runs on GPUs"):
        make_sampler("vllm", ckpt, device="cpu")


@pytest.mark.skipif(
    VLLM_ERROR is None, reason="vllm imports here; this checks the message when it does not"
)
def test_vllm_backend_without_vllm_is_a_clear_input_error():
    with pytest.raises(InputError, match="--backend hf"):
        make_sampler("vllm", resolve_checkpoint("smollm2-135m"), device="auto")


# --------------------------------------------------------------------------- shared decode path


class ScriptedRows(Sampler):
    """A backend whose generate call returns fixed rows: how the shared code treats
    rows shaped like vLLM's (no padding) and like transformers' (padding after the stop)."""

    backend = "scripted"

    def __init__(self, tokenizer, rows: Sequence[Sequence[int]]) -> None:
        super().__init__(tokenizer, [tokenizer.eos_token_id], DEFAULT_TEMPLATE)
        self.rows = rows

    def _generate(self, prompt_ids, config, seed, on_progress):
        return self.rows

    def describe(self):
        return {"backend": self.backend}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_checkpoint("smollm2-135m"))


def test_shared_code_cuts_at_the_first_stop_and_labels_finish_reasons(tokenizer):
    eos = tokenizer.eos_token_id
    hello = tokenizer("Hello world", add_special_tokens=False)["input_ids"]
    rows = [
        [*hello, eos],  # vLLM-style: stopped, nothing after the stop token
        [*hello, eos, eos, eos],  # transformers-style: padding (= eos) after the stop
        [*hello, hello[0], hello[0]],  # ran to max_new_tokens
        [*hello],  # shorter than max_new_tokens without a stop token: vLLM left it out
    ]
    config = SamplingConfig(n=4, max_new_tokens=len(hello) + 2)
    out = ScriptedRows(tokenizer, rows).sample(["q"], config, seed=0)
    assert out.responses[:2] == ["Hello world", "Hello world"]
    assert out.n_tokens.tolist() == [len(hello) + 1, len(hello) + 1, len(hello) + 2, len(hello)]
    assert out.finish_reasons == ["stop", "stop", "length", "stop"]


def test_shared_code_checks_the_row_count(tokenizer):
    with pytest.raises(RuntimeError, match="expected 2"):
        ScriptedRows(tokenizer, [[1]]).sample(["q"], SamplingConfig(n=2, max_new_tokens=4), seed=0)


# --------------------------------------------------------------------------- hf backend


@pytest.fixture(scope="module")
def hf_sampler():
    """SmolLM2 on one CPU thread (on a shared CPU, extra OpenMP threads only spin)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_sampler("hf", resolve_checkpoint("smollm2-135m"), device="cpu", batch_size=4)
    torch.set_num_threads(before)


@pytest.mark.slow
def test_hf_sampling_counts_seeds_and_finish_reasons(hf_sampler):
    config = SamplingConfig(n=3, max_new_tokens=16)
    seen: list[int] = []
    first = hf_sampler.sample(PROBLEMS, config, seed=7, on_progress=seen.append)
    assert len(first.responses) == 6 and first.n_tokens.shape == (6,)
    assert seen == [3, 3] and sum(seen) == 6  # batch 4 holds one prompt's 3 samples per call
    assert first.n_tokens.dtype == np.int32
    assert ((first.n_tokens >= 1) & (first.n_tokens <= 16)).all()
    length = np.asarray(first.finish_reasons) == "length"
    assert (first.n_tokens[length] == 16).all()
    assert all(r in ("stop", "length") for r in first.finish_reasons)
    assert all("<|im_end|>" not in r for r in first.responses)
    assert len(set(first.responses)) > 1

    again = hf_sampler.sample(PROBLEMS, config, seed=7)
    assert again.responses == first.responses
    np.testing.assert_array_equal(again.n_tokens, first.n_tokens)
    other = hf_sampler.sample(PROBLEMS, config, seed=8)
    assert other.responses != first.responses


@pytest.mark.slow
def test_hf_splits_many_samples_of_one_prompt_over_calls(hf_sampler):
    seen: list[int] = []
    out = hf_sampler.sample(
        PROBLEMS[:1], SamplingConfig(n=6, max_new_tokens=8), seed=0, on_progress=seen.append
    )
    assert seen == [4, 2]
    assert len(out.responses) == 6


@pytest.mark.slow
def test_hf_left_padding_gives_the_same_greedy_tokens_as_one_at_a_time(hf_sampler):
    config = SamplingConfig(n=1, temperature=0.0, max_new_tokens=12)
    batched = hf_sampler.sample(PROBLEMS, config, seed=0)
    hf_sampler.batch_size = 1
    try:
        single = hf_sampler.sample(PROBLEMS, config, seed=0)
    finally:
        hf_sampler.batch_size = 4
    assert batched.responses == single.responses
    np.testing.assert_array_equal(batched.n_tokens, single.n_tokens)


def tokenizer_decode(sampler, rows):
    return [
        sampler.tokenizer.decode(sampler._cut_at_stop(np.asarray(r)), skip_special_tokens=True)
        for r in rows
    ]


@pytest.mark.slow
def test_hf_prefix_sharing_draws_what_num_return_sequences_draws(hf_sampler):
    # The sampler runs each prompt once and repeats its KV cache; transformers' own
    # num_return_sequences recomputes the prompt per sample. Same seed, same tokens.
    import torch

    model, tokenizer = hf_sampler.model, hf_sampler.tokenizer
    (ids,) = hf_sampler.prompt_token_ids(PROBLEMS[:1])
    torch.manual_seed(5)
    reference = model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        num_return_sequences=4,
        max_new_tokens=12,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=hf_sampler.stop_ids.tolist(),
    )[:, len(ids) :]
    expected = tokenizer_decode(hf_sampler, reference.tolist())
    assert (
        hf_sampler.sample(PROBLEMS[:1], SamplingConfig(n=4, max_new_tokens=12), seed=5).responses
        == expected
    )


@pytest.mark.slow
def test_hf_repeated_prompt_cache_gives_identical_greedy_rows(hf_sampler):
    greedy = SamplingConfig(n=1, temperature=0.0, max_new_tokens=10)
    rows = hf_sampler._generate_call(hf_sampler.prompt_token_ids(PROBLEMS), 3, greedy)
    assert rows[0] == rows[1] == rows[2] and rows[3] == rows[4] == rows[5]
    single = hf_sampler.sample(PROBLEMS, greedy, seed=0)
    assert tokenizer_decode(hf_sampler, [rows[0], rows[3]]) == single.responses


# --------------------------------------------------------------------------- vllm backend


@pytest.fixture(scope="module")
def vllm_sampler():
    return make_sampler("vllm", resolve_checkpoint("smollm2-135m"), device="auto")


@pytest.mark.vllm
@needs_vllm
def test_vllm_sampling_counts_seeds_and_finish_reasons(vllm_sampler):
    config = SamplingConfig(n=4, max_new_tokens=32)
    first = vllm_sampler.sample(PROBLEMS, config, seed=7)
    assert len(first.responses) == 8
    assert ((first.n_tokens >= 1) & (first.n_tokens <= 32)).all()
    length = np.asarray(first.finish_reasons) == "length"
    assert (first.n_tokens[length] == 32).all()
    assert all("<|im_end|>" not in r for r in first.responses)
    assert vllm_sampler.sample(PROBLEMS, config, seed=7).responses == first.responses
    assert vllm_sampler.sample(PROBLEMS, config, seed=8).responses != first.responses


@pytest.mark.vllm
@needs_vllm
def test_vllm_samples_of_a_prompt_do_not_depend_on_the_other_prompts(vllm_sampler):
    config = SamplingConfig(n=4, max_new_tokens=24)
    together = vllm_sampler.sample(PROBLEMS, config, seed=3)
    alone = vllm_sampler.sample(PROBLEMS[:1], config, seed=3)
    assert together.responses[:4] == alone.responses


@pytest.mark.vllm
@needs_vllm
def test_vllm_tensor_parallel_size_is_passed_through():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs for tensor parallelism")
    sampler = make_sampler("vllm", resolve_checkpoint("smollm2-135m"), tensor_parallel_size=2)
    assert sampler.describe()["tensor_parallel_size"] == 2
    out = sampler.sample(PROBLEMS[:1], SamplingConfig(n=2, max_new_tokens=8), seed=0)
    assert len(out.responses) == 2
