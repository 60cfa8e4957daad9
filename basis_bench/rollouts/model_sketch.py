"""Sketches of the whole model's score grad_theta log pi(y | x), every parameter, one
backward pass per prompt: the check that the output layer's sketch
(:mod:`basis_bench.rollouts.score_sketch`) ranks gradients as the full model's do.

A batch's summed loss sum_i log pi(y_i | x) has, at every module, the per-row activations
and output gradients of each response alone (rows do not interact), so each parameter
block's per-response gradient is a sum over that row's positions, sketched without ever
being formed:

* a linear map W (out x in), G = sum_t d_t h_t^T:   u_k^T G w_k = sum_t (u_k . d_t)(w_k . h_t)
* an embedding E (V x H) looked up at x_t, G = sum_t e_{x_t} d_t^T: sum_t u_k[x_t] (w_k . d_t)
* a scale vector g (an RMSNorm weight, y = g o n), G = sum_t d_t o n_t: r_k . G

with independent Rademacher vectors (u_k, w_k) or r_k per block, each term / sqrt(K) and
the blocks summed: E<s(y), s(y')> = sum over blocks <G(y), G(y')> = the full inner product.
A weight shared by two modules (the output layer tied to the embedding) is one block with
one pair, and its pair is the output-layer sketch's own (same seed), so that part of this
sketch equals :func:`~basis_bench.rollouts.score_sketch.score_sketches` exactly. Any other
parameter-holding module is refused: the sketch covers every parameter or says which not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from basis_bench.errors import InputError
from basis_bench.rollouts.logits import response_logits
from basis_bench.rollouts.score_sketch import ScoreProjection, output_layer

PARAMETERS = "every parameter (linear maps, the tied embedding, norm scales)"
"""What :func:`model_score_sketches` covers, for a dataset's metadata."""


def _signs(seed: int, stream: int, n: int, k: int) -> Any:
    """(n, K) Rademacher signs of one stream (float32 torch), from the seed alone."""
    import torch

    rng = np.random.default_rng([seed, stream, n])
    return torch.from_numpy(
        (rng.integers(0, 2, size=(n, k), dtype=np.int8) * 2 - 1).astype(np.float32)
    )


class _Block:
    """One parameter's projection and its running (rows, K) sketch."""

    def __init__(self, u: Any, w: Any | None) -> None:
        self.u, self.w = u, w
        self.sum: Any = None

    def reset(self, rows: int) -> None:
        import torch

        self.sum = torch.zeros((rows, self.u.shape[1]), dtype=torch.float64)

    def linear(self, d: Any, h: Any) -> None:  # d (B, T, out), h (B, T, in)
        self.sum += ((d @ self.u) * (h @ self.w)).sum(dim=1).double()

    def lookup(self, ids: Any, d: Any) -> None:  # ids (B, T), d (B, T, H)
        self.sum += (self.u[ids] * (d @ self.w)).sum(dim=1).double()

    def scale(self, d: Any, n: Any) -> None:  # d, n (B, T, H)
        self.sum += ((d * n).sum(dim=1) @ self.u).double()


def _plan(model: Any, k: int, seed: int) -> tuple[dict[int, _Block], list[tuple]]:
    """Each distinct parameter's block and each module's (module, kind, block): the output
    layer's weight takes the output-layer sketch's pair; every other block its own."""
    import torch

    _, head = output_layer(model)
    vocab, hidden = head.weight.shape
    out_pair = ScoreProjection.make(k, seed, int(vocab), int(hidden))
    blocks: dict[int, _Block] = {
        id(head.weight): _Block(torch.from_numpy(out_pair.u), torch.from_numpy(out_pair.w))
    }
    modules, covered = [], {id(head.weight)}
    for index, (name, module) in enumerate(model.named_modules()):
        own = list(module.parameters(recurse=False))
        if not own:
            continue
        weight = getattr(module, "weight", None)
        if len(own) != 1 or weight is None or own[0] is not weight:
            raise InputError(f"{name} ({type(module).__name__}): a bias or an extra parameter; "
                             "the full-model sketch covers bias-free linear maps, embeddings "
                             "and norm scales")  # fmt: skip
        if isinstance(module, torch.nn.Linear):
            kind = "linear"
        elif isinstance(module, torch.nn.Embedding):
            kind = "lookup"
        elif weight.dim() == 1 and "norm" in type(module).__name__.lower():
            kind = "scale"
        else:
            raise InputError(f"{name} ({type(module).__name__}): not a module the full-model "
                             "sketch knows the per-sample gradient of")  # fmt: skip
        if id(weight) not in blocks:
            shape = weight.shape
            u = _signs(seed, 2 * index + 1, shape[0], k)
            w = None if kind == "scale" else _signs(seed, 2 * index + 2, shape[1], k)
            blocks[id(weight)] = _Block(u, w)
        covered.add(id(weight))
        modules.append((module, kind, blocks[id(weight)]))
    missing = {id(p) for p in model.parameters()} - covered
    if missing:
        raise InputError(f"{len(missing)} parameter(s) outside every known module")
    return blocks, modules


def model_score_sketches(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[np.ndarray],
    prompt_of: Sequence[int] | np.ndarray,
    temperature: float,
    k: int,
    seed: int,
) -> np.ndarray:
    """(N, K) float32: the sketch of each response's score over every parameter (module
    docstring); response i answers prompt ``prompt_of[i]``, its tokens scored under
    softmax(z / T) as sampled, the stop token included. One forward and backward pass per
    prompt, its responses right-padded together."""

    if temperature <= 0:
        raise InputError("score sketches need a sampling temperature above 0")
    out = np.zeros((len(response_ids), k))
    of = np.asarray(prompt_of)
    blocks, modules = _plan(model, k, seed)
    model.zero_grad(set_to_none=True)
    for p, prompt in enumerate(prompt_ids):
        mine = np.flatnonzero(of == p).tolist()
        if not mine:
            continue
        for block in blocks.values():
            block.reset(len(mine))
        hooks = [m.register_forward_hook(_hook(kind, block)) for m, kind, block in modules]
        try:
            _backward(model, list(prompt), [np.asarray(response_ids[i]) for i in mine], temperature)
        finally:
            for h in hooks:
                h.remove()
        model.zero_grad(set_to_none=True)
        out[mine] = np.sum([b.sum.numpy() for b in blocks.values()], axis=0)
    return (out / np.sqrt(k)).astype(np.float32)


def _hook(kind: str, block: _Block) -> Any:
    """A forward hook that keeps the module's input and, through a tensor hook on its
    output, feeds the block the output's gradient when the backward pass reaches it."""

    def hook(module: Any, inputs: tuple, output: Any) -> None:
        x = inputs[0].detach()
        if kind == "scale":
            normed = (output / module.weight).detach()  # y = g o n
            output.register_hook(lambda d: block.scale(d.float(), normed.float()))
        elif kind == "lookup":
            output.register_hook(lambda d: block.lookup(x, d.float()))
        else:
            output.register_hook(lambda d: block.linear(d.float(), x.float()))

    return hook


def _backward(
    model: Any, prompt: list[int], responses: list[np.ndarray], temperature: float
) -> None:
    """One pass of sum_i log pi(y_i | x) over the prompt's right-padded responses."""
    import torch

    logits, targets, mask = response_logits(
        model, [prompt] * len(responses), responses, 0, temperature
    )
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets[..., None])[..., 0]
    picked[mask.bool()].sum().backward()
