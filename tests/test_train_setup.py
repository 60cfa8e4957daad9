"""train/setup.py on a tiny random Llama (fast tier): the device paths the paper's config turns
on (gradient checkpointing) work on any transformers version here, and the sampler a run gets
from its backend (auto: hf here; a weight-sync backend follows the policy)."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
from conftest import import_extra

from basis_bench.errors import InputError
from basis_bench.rollouts.sampling import Sampler, register_sampler, registry
from basis_bench.rollouts.sampling.hf import HFSampler
from basis_bench.train import make_config
from basis_bench.train.loop import open_run
from basis_bench.train.setup import load_models, setup, sync_sampler

# every test here needs torch: without the [hf] extra the module is skipped, naming it
torch = import_extra("hf", "torch")


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A 1-layer Llama with a word-level tokenizer, saved as a Hugging Face folder."""
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1,
        )
    ).save_pretrained(tmp_path)  # fmt: skip
    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", "a", "b", "c", "d", "e", "f"])}
    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")), eos_token="<eos>"
    ).save_pretrained(tmp_path)
    return tmp_path


def test_gradient_checkpointing_is_on_and_silent_and_gradients_match(tiny_model_dir):
    ids = torch.tensor([[2, 3, 4, 5, 6, 7]])

    def grads(checkpointing: bool) -> list[torch.Tensor]:
        config = make_config(
            {"model": str(tiny_model_dir), "device": "cpu", "gradient_checkpointing": checkpointing}
        )
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # no deprecated name is called
            policy = load_models(config, "cpu").policy
        assert policy.is_gradient_checkpointing is checkpointing
        policy.train()
        policy(input_ids=ids, labels=ids).loss.backward()
        return [p.grad.clone() for p in policy.parameters() if p.grad is not None]

    plain, checkpointed = grads(False), grads(True)
    assert len(plain) == len(checkpointed) > 0
    for a, b in zip(plain, checkpointed, strict=True):
        torch.testing.assert_close(a, b)


# --------------------------------------------------------------------------- the sampler


def _vllm_imports() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a torch extension built for another torch
        return False
    return True


class Synced(HFSampler):
    """A registered test backend with weight sync: a transformers copy of its own, loaded
    from the reference checkpoint, that takes the policy's weights as vLLM's engine does."""

    backend = "synced"
    capabilities = dataclasses.replace(HFSampler.capabilities, weight_sync=True)

    def load_weights(self, named_tensors):
        self.model.load_state_dict(dict(named_tensors))


def train_setup(root, **settings):
    config = make_config(
        {
            "model": str(root / "model"),
            "device": "cpu",
            "estimator": "grpo",  # no reference cache: nothing is sampled in setup
            "run_dir": str(root / "run"),
            **settings,
        }
    )
    return setup(config)


@pytest.fixture
def root(tiny_model_dir, tmp_path):
    (tmp_path / "model").symlink_to(tiny_model_dir)
    return tmp_path


@pytest.mark.skipif(_vllm_imports(), reason="vllm imports here: auto chooses it")
def test_auto_backend_samples_the_live_policy_with_hf_and_the_run_records_it(root):
    run = train_setup(root)
    assert make_config({}).generation.backend == "auto"
    assert run.config.generation.backend == "hf"
    assert type(run.sampler) is HFSampler and run.sampler.model is run.models.policy
    open_run(run, 1)
    assert json.loads((root / "run" / "config.json").read_text())["backend"] == "hf"


def test_a_weight_sync_backend_starts_from_the_reference_and_follows_the_policy(root):
    with registry.SAMPLERS.temporary():
        register_sampler(Synced)
        run = train_setup(root, backend="synced")
    policy, sampler = run.models.policy, run.sampler
    assert type(sampler) is Synced and sampler.model is not policy
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    before = dict(sampler.model.state_dict())
    assert all(not torch.equal(before[k], v) for k, v in policy.state_dict().items())
    sync_sampler(sampler, policy)
    for name, value in policy.state_dict().items():
        torch.testing.assert_close(sampler.model.state_dict()[name], value)


def test_auto_trains_with_hf_where_the_preferred_engine_does_not_start(root):
    """A preferred backend whose engine fails at start (vllm's LLM raised): auto trains with
    the live policy on hf after one warning, and config.json records hf; the backend named
    in the config is refused with the engine's line."""
    from basis_bench.rollouts.sampling.base import EngineFailed

    class Stalled(Synced):
        backend = "stalled"
        preferred = True

        @classmethod
        def start(cls, *args, **kwargs):
            raise EngineFailed("the stalled engine did not start")

    with registry.SAMPLERS.temporary():
        register_sampler(Stalled)
        with pytest.warns(registry.BackendFallback) as said:
            run = train_setup(root)
        with pytest.raises(EngineFailed, match="stalled engine did not start"):
            train_setup(root, backend="stalled", run_dir=str(root / "named"))
    assert str(said[-1].message) == "backend auto samples with hf: the stalled engine did not start"
    assert type(run.sampler) is HFSampler and run.sampler.model is run.models.policy
    assert run.config.generation.backend == "hf"
    open_run(run, 1)
    assert json.loads((root / "run" / "config.json").read_text())["backend"] == "hf"


def test_a_backend_that_cannot_follow_a_policy_is_refused_before_models_load(root, monkeypatch):
    import basis_bench.train.setup as setup_module

    class OracleOnly(Synced):
        backend = "oracle-only"
        capabilities = dataclasses.replace(HFSampler.capabilities, weight_sync=False)
        of_policy = Sampler.of_policy

    def loaded(*args, **kwargs):
        raise AssertionError("a model loaded before the backend was checked")

    monkeypatch.setattr(setup_module, "load_models", loaded)
    with registry.SAMPLERS.temporary():
        register_sampler(OracleOnly)
        with pytest.raises(InputError, match="oracle-only backend cannot sample a model being"):
            train_setup(root, backend="oracle-only")


def test_heldout_limit_counts_prompts_outside_the_training_set():
    """The limit applies after the training prompts are dropped: N really held-out prompts
    (cutting first left about half of N when the sources overlap)."""
    from basis_bench.train.setup import load_data

    notes: list[str] = []
    config = make_config(
        {
            "train_prompts": "arithmetic:n=100,digits=1,steps=1,ops=+-,seed=0",
            "heldout_prompts": "arithmetic:n=200,digits=1,steps=1,ops=+-,seed=1",
            "heldout_limit": 30,
        }
    )
    data = load_data(config, note=notes.append)
    assert data.heldout_set.height == 30
    assert not set(data.heldout_set["prompt_id"]) & set(data.train_set["prompt_id"])
    assert notes == [
        "held-out accuracy is over 30 prompts: 100 of the 200 in heldout_prompts are "
        "training prompts too and are left out; the first 30 of the rest are kept"
    ]
    everything = load_data(dataclasses.replace(config, heldout_limit=0), note=notes.append)
    assert everything.heldout_set.head(30).equals(data.heldout_set)  # the first 30, in order
