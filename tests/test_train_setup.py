"""train/setup.py's model loading on a tiny random Llama (fast tier): the device paths the
paper's config turns on (gradient checkpointing) work on any transformers version here."""

from __future__ import annotations

import warnings

import pytest
import torch

from basis_bench.train import make_config
from basis_bench.train.setup import load_models


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
