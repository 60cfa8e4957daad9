"""Per-rollout sketches of the sequence score, the vector the policy gradient is made of.

A rollout y of prompt x contributes A(y) grad_theta log pi(y | x) to a policy-gradient step.
For the output layer W (logits z_t = W h_t, the distribution that sampled
p_t = softmax(z_t / T)) the score is a sum over the response's tokens of outer products::

    S(y) = d log pi(y | x) / dW = (1 / T) sum_t (e_{y_t} - p_t) h_t^T        (V x H)

which one forward pass gives: no backward pass. Stored whole it is V x H numbers a rollout
(28 M for SmolLM2-135M), so it is compressed by a tensor sketch: K independent Rademacher
pairs u_k in {-1, 1}^V, w_k in {-1, 1}^H, fixed by a seed, and

    s_k(y) = u_k^T S(y) w_k / sqrt(K),

so that E_u,w[<s(y), s(y')>] = <S(y), S(y')>_F exactly (E[u u^T] = I, E[w w^T] = I): inner
products, squared norms and therefore gradient variances estimated from sketches are
unbiased for the exact ones. One projection (one seed) serves every checkpoint of a dataset,
so gradients at different checkpoints live in one space. Per token the cost is p_t @ U, a
V x K product: less than the output layer's own V x H.

The parameters covered are the output projection's as a parameter of its own. Where the model
ties it to the input embedding (SmolLM2 does), the sketch is the part of the tied weight's
gradient that flows through the logits, not the embedding lookup's part.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from basis_bench.errors import InputError

SKETCH_COLUMN = "score_sketch"
"""The rollouts column holding each rollout's sketch (a list of K float16)."""

PARAMETERS = "output layer (lm_head), sampling distribution softmax(logits / T)"
"""What the sketch covers, as recorded in the dataset's metadata."""

KIND = "rademacher tensor sketch: s_k = u_k^T S w_k / sqrt(K), u_k in {-1,1}^V, w_k in {-1,1}^H"
"""How the sketch is made, as recorded in the dataset's metadata."""


@dataclass(frozen=True)
class ScoreProjection:
    """The K Rademacher pairs (u_k, w_k) of seed ``seed`` for a vocabulary of V and hidden
    size H: ``u`` (V, K), ``w`` (H, K), each entry +-1, drawn by numpy's PCG64 from the seed
    alone (so the same seed gives the same projection on any machine)."""

    k: int
    seed: int
    u: np.ndarray
    w: np.ndarray

    @classmethod
    def make(cls, k: int, seed: int, vocab: int, hidden: int) -> ScoreProjection:
        if k < 1:
            raise InputError(f"--store-scores must be at least 1; got {k}")
        rng = np.random.default_rng([seed, vocab, hidden])
        signs = rng.integers(0, 2, size=(vocab + hidden, k), dtype=np.int8) * 2 - 1
        return cls(k, seed, signs[:vocab].astype(np.float32), signs[vocab:].astype(np.float32))


def score_sketch_entry(job: Any) -> dict[str, Any]:
    """The metadata entry (``run.score_sketch`` of every part) naming an oracle job's sketch:
    its column, K, seed and what it covers, enough to rebuild the projection."""
    return {
        "column": SKETCH_COLUMN,
        "k": job.store_scores,
        "seed": job.score_seed,
        "kind": KIND,
        "parameters": PARAMETERS,
    }


@functools.lru_cache(maxsize=2)
def _projection(k: int, seed: int, vocab: int, hidden: int) -> ScoreProjection:
    return ScoreProjection.make(k, seed, vocab, hidden)


def projection_of(model: Any, k: int, seed: int) -> ScoreProjection:
    """The projection of ``k`` pairs and ``seed`` for ``model``'s output layer (made once per
    process and shape)."""
    vocab, hidden = output_layer(model)[1].weight.shape
    return _projection(k, seed, int(vocab), int(hidden))


def output_layer(model: Any) -> tuple[Any, Any]:
    """(decoder, lm_head) of a transformers causal LM: the module that gives the final hidden
    states and the linear map from them to the logits."""
    head = model.get_output_embeddings()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if head is None or decoder is None or getattr(head, "bias", None) is not None:
        raise InputError(
            f"{type(model).__name__}: score sketches need a causal LM whose logits are a "
            "bias-free linear map of its decoder's final hidden states"
        )
    if getattr(model.config, "final_logit_softcapping", None):
        raise InputError(f"{type(model).__name__} caps its logits; score sketches do not")
    return decoder, head


def score_sketches(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[np.ndarray],
    prompt_of: Sequence[int] | np.ndarray,
    temperature: float,
    projection: ScoreProjection,
) -> np.ndarray:
    """(N, K) float32: the sketch of each response's output-layer score (module docstring).
    Response i answers prompt ``prompt_of[i]``; its tokens are scored under softmax(z / T) at
    every position, the stop token included, exactly as they were sampled (top_p = 1). Each
    prompt runs through the model once; its responses then run together on its KV cache."""
    import torch

    if temperature <= 0:
        raise InputError("score sketches need a sampling temperature above 0")
    decoder, head = output_layer(model)
    weight = head.weight.detach().float().cpu()
    u, w = torch.from_numpy(projection.u), torch.from_numpy(projection.w)
    if u.shape[0] != weight.shape[0] or w.shape[0] != weight.shape[1]:
        raise InputError(
            f"the projection is for a {u.shape[0]} x {w.shape[0]} output layer; this model's "
            f"is {weight.shape[0]} x {weight.shape[1]}"
        )
    out = np.zeros((len(response_ids), projection.k))
    of = np.asarray(prompt_of)
    with torch.inference_mode():
        for p, prompt in enumerate(prompt_ids):
            mine = np.flatnonzero(of == p).tolist()
            if mine:  # every token of the prompt's responses in one product
                states = _response_states(decoder, prompt, [response_ids[i] for i in mine])
                h = torch.cat([state for state, _ in states])  # (tokens, H)
                ys = torch.from_numpy(np.concatenate([ys for _, ys in states]).astype(np.int64))
                prob = torch.softmax((h @ weight.T) / temperature, dim=-1)  # (tokens, V)
                per_token = ((u[ys] - prob @ u) * (h @ w)).double()  # U^T (e_y - p) o W^T h
                owner = torch.repeat_interleave(torch.arange(len(mine)),
                                                torch.tensor([len(y) for _, y in states]))  # fmt: skip
                summed = torch.zeros((len(mine), projection.k), dtype=torch.float64)
                out[mine] = summed.index_add_(0, owner, per_token).numpy()
    return (out / (temperature * np.sqrt(projection.k))).astype(np.float32)


def _response_states(decoder: Any, prompt: Sequence[int], responses: Sequence[np.ndarray]) -> list:
    """For each response, the (n, H) final hidden states that predicted its n tokens, and the
    tokens: the prompt's last state, then the response's own states but its last."""
    import torch

    from basis_bench.rollouts.models import cache_argument

    cache_arg = cache_argument(decoder)
    device = next(decoder.parameters()).device
    from transformers import DynamicCache

    cache = DynamicCache()
    first = (
        decoder(
            input_ids=torch.tensor([list(prompt)], device=device),
            use_cache=True,
            **{cache_arg: cache},
        )
        .last_hidden_state[0, -1]
        .float()
        .cpu()
    )
    width = max(len(r) for r in responses)
    if width <= 1:
        return [(first[None].expand(len(r), -1), r) for r in responses]
    cache.batch_repeat_interleave(len(responses))
    tokens = torch.zeros((len(responses), width - 1), dtype=torch.long)
    mask = torch.zeros((len(responses), len(prompt) + width - 1), dtype=torch.long)
    mask[:, : len(prompt)] = 1
    for row, r in enumerate(responses):
        tokens[row, : len(r) - 1] = torch.from_numpy(np.asarray(r[:-1], dtype=np.int64))
        mask[row, len(prompt) : len(prompt) + len(r) - 1] = 1
    position = torch.arange(len(prompt), len(prompt) + width - 1).expand(len(responses), -1)
    rest = decoder(
        input_ids=tokens.to(device), attention_mask=mask.to(device),
        position_ids=position.to(device), use_cache=True, **{cache_arg: cache},
    ).last_hidden_state.float().cpu()  # fmt: skip
    return [
        (torch.cat([first[None], rest[row, : len(r) - 1]]), r) for row, r in enumerate(responses)
    ]
