"""The sampler interface: call planning, the shared decode path, and the hf backend on the
real SmolLM2 model (the vllm backend: tests/test_vllm.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from basis_bench.errors import InputError
from basis_bench.rollouts.models import load_tokenizer, resolve_checkpoint
from basis_bench.rollouts.sampling import (
    SamplingConfig,
    make_sampler,
    register_sampler,
    registry,
    sampler_class,
)
from basis_bench.rollouts.sampling.base import Capabilities, Sampler
from basis_bench.rollouts.sampling.hf import (
    HFSampler,
    HFSettings,
    last_token_hidden_states,
    length_batches,
    plan_calls,
)
from basis_bench.rollouts.sampling.vllm import VLLMSampler
from basis_bench.rollouts.templates import DEFAULT_TEMPLATE

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


def test_length_batches_group_similar_lengths_within_the_token_budget():
    lengths = [5, 40, 6, 12, 5, 100]
    batches = length_batches(lengths, max_tokens=24)
    assert batches == [[0, 4, 2], [3], [1], [5]]  # sorted; 3 x 6 <= 24 < 4 x 12; 100 alone
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert length_batches(lengths, max_tokens=1) == [[0], [4], [2], [3], [1], [5]]
    assert length_batches([], 8) == []


def test_sampling_config_validation():
    for bad in (
        {"n": 0},
        {"n": 2, "temperature": 0.0},
        {"n": 1, "temperature": -1.0},
        {"n": 1, "top_p": 0.0},
        {"n": 1, "top_p": 1.5},
        {"n": 1, "max_new_tokens": 0},
        {"n": 1, "temperature": float("nan")},
        {"n": 1, "top_p": float("nan")},
    ):
        with pytest.raises(InputError):
            SamplingConfig(**bad)
    assert SamplingConfig(n=1, temperature=0.0).temperature == 0.0


def test_make_sampler_rejects_bad_backend_settings():
    ckpt = resolve_checkpoint("smollm2-135m")
    with pytest.raises(InputError, match="unknown sampling backend 'tgi'; registered: hf, vllm"):
        make_sampler("tgi", ckpt)
    with pytest.raises(TypeError, match="the hf backend takes HFSettings"):
        make_sampler("hf", ckpt, settings=VLLMSampler.Settings())


# --------------------------------------------------------------------------- the registry


def _vllm_imports() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a torch extension built for another torch
        return False
    return True


class Claims(HFSampler):
    """A registered test backend: the hf sampler under another name, on the CPU only."""

    backend = "claims"
    preferred = True
    capabilities = Capabilities(
        devices=("cpu",),
        per_prompt_seeds=True,
        hidden_states=True,
        weight_sync=False,
        cpu_workers=False,
    )


class GpuOnly(Claims):
    backend = "gpu-only"
    capabilities = Capabilities(
        devices=("cuda",),
        per_prompt_seeds=True,
        hidden_states=True,
        weight_sync=False,
        cpu_workers=False,
    )


@pytest.mark.skipif(_vllm_imports(), reason="vllm imports here: auto chooses it")
def test_auto_is_hf_where_vllm_does_not_import():
    assert sampler_class("auto", "cpu") is HFSampler
    assert sampler_class("auto", "cuda") is HFSampler
    assert sampler_class("vllm", "cpu") is VLLMSampler  # named: no check until it starts


@pytest.mark.skipif(_vllm_imports(), reason="vllm imports here: auto chooses it first")
def test_auto_takes_the_first_preferred_backend_that_serves_the_device():
    with registry.SAMPLERS.temporary() as samplers:
        register_sampler(GpuOnly)
        assert sampler_class("auto", "cpu") is HFSampler  # it does not serve the CPU
        register_sampler(Claims)
        assert sampler_class("auto", "cpu") is Claims
        assert sampler_class("auto", "cuda:1") is GpuOnly
        assert registry.backend_names() == ("auto", "hf", "vllm", "gpu-only", "claims")
        with pytest.raises(ValueError, match="sampling backend 'claims' is already registered"):
            register_sampler(Claims)
        with pytest.raises(ValueError, match="name 'auto' is taken"):
            register_sampler(type("Auto", (Claims,), {"backend": "auto"}))
        assert "claims" in samplers
    assert registry.backend_names() == ("auto", "hf", "vllm")
    with pytest.raises(TypeError, match="does not define capabilities, Settings, start"):
        register_sampler(type("Bare", (Sampler,), {"backend": "bare"}))


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


# --------------------------------------------------------------------------- sampling rule


def test_draw_tokens_follows_softmax_of_logits_over_temperature():
    import torch

    from basis_bench.rollouts.sampling.continuous import draw_tokens

    probs = np.array([0.5, 0.3, 0.15, 0.05, 0.0])
    logits = torch.tensor(np.log(probs + 1e-300), dtype=torch.float32) * 0.5  # T = 0.5 undoes it
    u = torch.tensor(np.random.default_rng(0).random(20_000))
    picked = np.asarray(draw_tokens(logits.expand(len(u), -1), 0.5, 1.0, u))
    counts = np.bincount(picked, minlength=5)
    assert counts[4] == 0  # a token of zero probability is never drawn
    # Chi-square, 3 degrees of freedom: 16.3 is the 0.1% point; a sampler that ignored
    # the temperature (probabilities ~ sqrt(p)) lands in the hundreds.
    expected = probs[:4] * len(u)
    assert ((counts[:4] - expected) ** 2 / expected).sum() < 16.3
    # The ends of [0, 1): the first token, and the last one with positive probability.
    ends = torch.tensor([0.0, 1 - 1e-12, 1.0], dtype=torch.float64)
    assert draw_tokens(logits.expand(3, -1), 1.0, 1.0, ends) == [0, 3, 3]


def test_draw_tokens_keeps_transformers_top_p_nucleus():
    import torch
    from transformers.generation.logits_process import TopPLogitsWarper

    from basis_bench.rollouts.sampling.continuous import draw_tokens

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1)) * 2
    for top_p in (0.3, 0.8, 0.95):
        kept = torch.isfinite(TopPLogitsWarper(top_p)(None, logits.clone()))
        u = torch.linspace(0, 1 - 1e-9, 400, dtype=torch.float64)
        for row in range(logits.shape[0]):
            drawn = set(draw_tokens(logits[row].expand(len(u), -1), 1.0, top_p, u))
            assert drawn == set(torch.nonzero(kept[row]).flatten().tolist())


# --------------------------------------------------------------------------- hf backend


@pytest.fixture(scope="module")
def hf_sampler():
    """SmolLM2 on one CPU thread (on a shared CPU, extra OpenMP threads only spin)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_sampler(
        "hf", resolve_checkpoint("smollm2-135m"), device="cpu", settings=HFSettings(batch_size=4)
    )
    torch.set_num_threads(before)


@pytest.fixture
def generate_sampler(hf_sampler):
    """The old path, plain transformers ``generate``, on the same model."""
    from basis_bench.rollouts.sampling.hf import HFSampler

    return HFSampler(hf_sampler.model, hf_sampler.tokenizer, DEFAULT_TEMPLATE, 4, engine="generate")


@pytest.mark.slow
def test_hf_sampling_counts_seeds_and_finish_reasons(hf_sampler):
    config = SamplingConfig(n=3, max_new_tokens=16)
    finished: list[int] = []
    tokens: list[int] = []
    first = hf_sampler.sample(
        PROBLEMS, config, seed=7, on_progress=lambda k, t: (finished.append(k), tokens.append(t))
    )
    assert len(first.responses) == 6 and first.n_tokens.shape == (6,)
    assert sum(finished) == 6 and sum(tokens) == first.n_tokens.sum()
    assert len(finished) > 2  # reported as sequences finish, not once at the end
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
def test_hf_stop_tokens_end_responses(hf_sampler):
    # Asked for only the answer, most responses stop early; those that stop end with a
    # stop id and hold no other, and only those that ran to max_new_tokens do not.
    from basis_bench.rollouts.templates import PromptTemplate

    hf_sampler.template = PromptTemplate(instruction="Give only the final answer.")
    try:
        out = hf_sampler.sample_tokens(
            ["What is 2 + 3?"], SamplingConfig(n=4, max_new_tokens=24), seed=1
        )
    finally:
        hf_sampler.template = DEFAULT_TEMPLATE
    stop = set(hf_sampler.stop_ids.tolist())
    assert "stop" in out.finish_reasons
    for ids, reason in zip(out.response_ids, out.finish_reasons, strict=True):
        assert not stop & set(ids[:-1].tolist())
        assert (int(ids[-1]) in stop) == (reason == "stop")
        assert reason == "stop" or len(ids) == 24


def plain_generate(sampler, problem: str, max_new_tokens: int, **sampling) -> list[int]:
    """One prompt through transformers ``generate`` alone (no batching, no padding)."""
    import torch

    (ids,) = sampler.prompt_token_ids([problem])
    out = sampler.model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
        max_new_tokens=max_new_tokens,
        pad_token_id=sampler.tokenizer.pad_token_id,
        eos_token_id=sampler.stop_ids.tolist(),
        **sampling,
    )
    return sampler._cut_at_stop(out[0, len(ids) :].numpy()).tolist()


GREEDY_PROBLEMS = [
    *PROBLEMS,
    "What is 12 * 7 - 5?",
    "Write the word 'cat' backwards.",
    "Name a prime number greater than 10.",
]


@pytest.mark.slow
def test_hf_greedy_matches_plain_generate_token_for_token(hf_sampler):
    # Five prompts of different lengths through 2 slots: rows leave and are refilled,
    # and every row attends over a width set by the longest; none of it changes a token.
    hf_sampler.batch_size = 2
    try:
        out = hf_sampler.sample_tokens(
            GREEDY_PROBLEMS, SamplingConfig(n=1, temperature=0.0, max_new_tokens=40), seed=0
        )
    finally:
        hf_sampler.batch_size = 4
    for problem, ids in zip(GREEDY_PROBLEMS, out.response_ids, strict=True):
        assert ids.tolist() == plain_generate(hf_sampler, problem, 40, do_sample=False)
    assert len({len(ids) for ids in out.response_ids}) > 1  # some stopped before others


@pytest.mark.slow
def test_hf_finished_sequences_leave_the_batch(hf_sampler):
    config = SamplingConfig(n=5, max_new_tokens=40)
    out = hf_sampler.sample(PROBLEMS, config, seed=3)
    stats = hf_sampler.last_stats
    # Each forward row makes one token (first tokens come from the prompt's own pass):
    # no row is ever spent on a finished sequence or on padding.
    assert stats.row_steps == out.n_tokens.sum() - len(out.n_tokens)
    assert max(stats.rows_per_step) == 4
    assert stats.rows_per_step[-1] < 4  # the batch shrinks once nothing waits
    assert stats.prefill_tokens == sum(len(p) for p in hf_sampler.prompt_token_ids(PROBLEMS))
    # ... whereas generate keeps a call's rows until its longest response ends.
    assert stats.steps < out.n_tokens.max() * -(-len(out.n_tokens) // 4)


@pytest.mark.slow
def test_hf_samples_do_not_depend_on_scheduling(hf_sampler):
    # Sample k of prompt p draws from its own random stream, so the batch size and the
    # other prompts change only float rounding in its logits, which almost never
    # changes a token. (Exact equality is guaranteed only for the same batch size.)
    config = SamplingConfig(n=4, max_new_tokens=24)
    together = hf_sampler.sample(PROBLEMS, config, seed=11)
    hf_sampler.batch_size = 3
    try:
        other_batch = hf_sampler.sample(PROBLEMS, config, seed=11)
    finally:
        hf_sampler.batch_size = 4
    alone = hf_sampler.sample(PROBLEMS[1:], config, seed=11)
    same = sum(a == b for a, b in zip(together.responses, other_batch.responses, strict=True))
    assert same >= 7
    # Prompt 1 alone is prompt index 0 of its call, so it draws other streams: it must
    # not reproduce the joint run (which would mean the streams ignore the prompt index).
    assert alone.responses != together.responses[4:]


ARITHMETIC = "arithmetic:n=6,digits=1,steps=1,seed=3"


def sample_stats(responses: list[str], n_tokens: np.ndarray, answers: list[str], n: int):
    from basis_bench.rollouts.rewards import RewardConfig, score

    rewards = np.concatenate(
        [
            score(responses[p * n : (p + 1) * n], a, RewardConfig(answer_format="number"))[0]
            for p, a in enumerate(answers)
        ]
    )
    return rewards, n_tokens.astype(float)


def z_score(a: np.ndarray, b: np.ndarray) -> float:
    se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return float(abs(a.mean() - b.mean()) / se) if se > 0 else 0.0


@pytest.mark.slow
def test_hf_samples_the_distribution_generate_samples(hf_sampler, generate_sampler):
    """Same mean reward and mean length as plain ``generate`` at T = 1.0, within Monte
    Carlo error: two-sample z-tests on 6 easy arithmetic prompts x 40 samples each.

    |z| < 3.5 would fail a correct sampler about 1 time in 2,000 (per statistic). The
    same test run against the continuous sampler at T = 0.5 must reject it: that shows
    the test has the power to catch a biased sampler, not that it passes anything.
    """
    from basis_bench.rollouts.prompts import load_prompt_source
    from basis_bench.rollouts.templates import PromptTemplate

    table = load_prompt_source(ARITHMETIC)
    problems, answers = table["problem"].to_list(), table["answer"].to_list()
    n, template = 40, PromptTemplate(instruction="Give only the final answer.")
    stats = {}
    for name, sampler, temperature in (
        ("continuous", hf_sampler, 1.0),
        ("generate", generate_sampler, 1.0),
        ("continuous T=0.5", hf_sampler, 0.5),
    ):
        sampler.template, sampler.batch_size = template, 64
        try:
            out = sampler.sample(
                problems, SamplingConfig(n=n, temperature=temperature, max_new_tokens=24), seed=5
            )
        finally:
            sampler.template, sampler.batch_size = DEFAULT_TEMPLATE, 4
        stats[name] = sample_stats(out.responses, out.n_tokens, answers, n)
    new, old, biased = stats["continuous"], stats["generate"], stats["continuous T=0.5"]
    assert 0.05 < new[0].mean() < 0.95  # rewards vary, so the reward test means something
    assert z_score(new[0], old[0]) < 3.5, (new[0].mean(), old[0].mean())
    assert z_score(new[1], old[1]) < 3.5, (new[1].mean(), old[1].mean())
    # Measured (6 x 40, seed 5): z = 0.8 (reward) and 0.2 (length) against generate; at
    # T = 0.7 already 3.9 and 4.6; the check uses T = 0.5, further off, for margin.
    assert max(z_score(biased[0], old[0]), z_score(biased[1], old[1])) > 3.5


@pytest.mark.slow
def test_hf_generate_engine_splits_many_samples_of_one_prompt_over_calls(generate_sampler):
    seen: list[int] = []
    out = generate_sampler.sample(
        PROBLEMS[:1],
        SamplingConfig(n=6, max_new_tokens=8),
        seed=0,
        on_progress=lambda k, t: seen.append(k),
    )
    assert seen == [4, 2]
    assert len(out.responses) == 6


def tokenizer_decode(sampler, rows):
    return [
        sampler.tokenizer.decode(sampler._cut_at_stop(np.asarray(r)), skip_special_tokens=True)
        for r in rows
    ]


@pytest.mark.slow
def test_hf_generate_engine_prefix_sharing_draws_what_num_return_sequences_draws(
    generate_sampler,
):
    # The old path runs each prompt once and repeats its KV cache; transformers' own
    # num_return_sequences recomputes the prompt per sample. Same seed, same tokens.
    import torch

    model, tokenizer = generate_sampler.model, generate_sampler.tokenizer
    (ids,) = generate_sampler.prompt_token_ids(PROBLEMS[:1])
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
        eos_token_id=generate_sampler.stop_ids.tolist(),
    )[:, len(ids) :]
    expected = tokenizer_decode(generate_sampler, reference.tolist())
    out = generate_sampler.sample(PROBLEMS[:1], SamplingConfig(n=4, max_new_tokens=12), seed=5)
    assert out.responses == expected


def test_hf_rejects_an_unknown_engine():
    from basis_bench.rollouts.sampling.hf import HFSampler

    with pytest.raises(InputError, match="engine must be one of"):
        HFSampler.__init__(object.__new__(HFSampler), None, None, engine="vllm")


def test_hidden_states_of_prompts_together_are_those_of_each_alone():
    """Left padding, the mask and the positions leave each prompt's last-token state as its
    own one-prompt pass gives it, up to float rounding (a 2-layer Llama, random weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    rng = np.random.default_rng(0)
    ids = [rng.integers(3, 64, size=k).tolist() for k in (9, 3, 17, 40, 4, 11)]
    alone = last_token_hidden_states(model, ids, max_tokens=1)
    together = last_token_hidden_states(model, ids, max_tokens=80)  # 4 prompts, then 2
    assert together.shape == (6, 32) and together.dtype == np.float32
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():  # alone is the model's plain unpadded pass
        plain = model(torch.tensor([ids[3]]), output_hidden_states=True).hidden_states[-1]
    np.testing.assert_allclose(alone[3], plain[0, -1].numpy(), rtol=1e-6, atol=1e-6)
