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
from basis_bench.rollouts.sampling.hf import length_batches

SKETCH_COLUMN = "score_sketch"
"""The rollouts column holding each rollout's sketch (a list of K float16)."""

PARAMETERS = "output layer (lm_head), sampling distribution softmax(logits / T)"
"""What the sketch covers, as recorded in the dataset's metadata."""

KIND = "rademacher tensor sketch: s_k = u_k^T S w_k / sqrt(K), u_k in {-1,1}^V, w_k in {-1,1}^H"
"""How the sketch is made, as recorded in the dataset's metadata."""

SKETCH_TOKENS = 4096
"""Most tokens (padding included) per forward pass of :func:`score_sketches`."""


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
    max_tokens: int = SKETCH_TOKENS,
) -> np.ndarray:
    """(N, K) float32: the sketch of each response's output-layer score (module docstring).
    Response i answers prompt ``prompt_of[i]``; its tokens are scored under softmax(z / T) at
    every position, the stop token included, exactly as they were sampled (top_p = 1)."""
    import torch

    if temperature <= 0:
        raise InputError("score sketches need a sampling temperature above 0")
    decoder, head = output_layer(model)
    weight = head.weight.detach().float()
    u = torch.from_numpy(projection.u)
    w = torch.from_numpy(projection.w)
    if u.shape[0] != weight.shape[0] or w.shape[0] != weight.shape[1]:
        raise InputError(
            f"the projection is for a {u.shape[0]} x {w.shape[0]} output layer; this model's "
            f"is {weight.shape[0]} x {weight.shape[1]}"
        )
    seqs = [
        list(prompt_ids[prompt_of[i]]) + [int(t) for t in r] for i, r in enumerate(response_ids)
    ]
    out = np.zeros((len(seqs), projection.k))
    scale = 1.0 / (temperature * np.sqrt(projection.k))
    with torch.inference_mode():
        for batch in length_batches([len(s) for s in seqs], max_tokens):
            width = max(len(seqs[i]) for i in batch)
            tokens = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                tokens[row, width - len(seqs[i]) :] = torch.tensor(seqs[i])
                mask[row, width - len(seqs[i]) :] = 1
            hidden = decoder(
                input_ids=tokens.to(weight.device),
                attention_mask=mask.to(weight.device),
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0).to(weight.device),
            ).last_hidden_state.float()
            # Position j's state predicts token j + 1: a response of n tokens is predicted by
            # the n positions before the sequence's end.
            rows: list[int] = []
            cols: list[int] = []
            ys: list[int] = []
            owner: list[int] = []
            for row, i in enumerate(batch):
                n = len(response_ids[i])
                rows += [row] * n
                cols += range(width - n - 1, width - 1)
                ys += [int(t) for t in response_ids[i]]
                owner += [i] * n
            if not ys:
                continue
            h = hidden[torch.tensor(rows), torch.tensor(cols)].cpu()  # (n_tok, H)
            p = torch.softmax((h @ weight.cpu().T) / temperature, dim=-1)  # (n_tok, V)
            a = u[torch.tensor(ys)] - p @ u  # U^T (e_y - p): (n_tok, K)
            np.add.at(out, np.asarray(owner), (a * (h @ w)).double().numpy())
    return (out * scale).astype(np.float32)
