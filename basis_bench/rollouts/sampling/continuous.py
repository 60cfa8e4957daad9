"""Continuous batching over a transformers model's KV cache: cost follows the tokens
really generated.

``generate`` keeps every sequence of a batch in it, padded, until the longest ends, so
at T = 1.0 one rambling sample sets the price of all of them. Here a fixed number of
*slots* decode together; a sequence leaves its slot as soon as it emits a stop token or
reaches ``max_new_tokens``, and the next waiting sequence takes the slot.

Mechanism (chosen by measurement, see docs/oracle.md):

- :class:`SlotCache` preallocates, per layer, key and value buffers of shape
  ``[slots, kv_heads, capacity, head_dim]``. Each row holds one sequence from column 0
  (no padding on the left); row ``i`` writes its next key/value at its own column
  ``length[i]``, in place (no ``torch.cat`` of the whole cache per step, which is what
  makes plain ``generate`` quadratic in the length).
- The live sequences are always rows ``0 .. live-1``: the model runs on that prefix of
  the buffers, so a finished sequence costs nothing from the next step on. A finished
  row is filled by moving the last live row into it (one row copied, not the cache).
- Each step attends over ``max(length) + 1`` columns with a boolean mask per row; the
  positions are per row (``length[i]``), so rows of different lengths decode together.
- Prefix sharing: each prompt is run through the model once; its KV is copied into the
  slot of each of its samples, and their first tokens are drawn from its last logits.

Randomness does not depend on scheduling: sample ``k`` of prompt ``p`` draws one
uniform number per token from its own stream, ``SeedSequence(seed, spawn_key=(p, k))``,
and picks the token by inverting the cumulative distribution. Which slot it runs in,
and what else runs beside it, changes only float rounding in its logits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

StepCallback = Callable[[int, int], None]
"""Called after each decode step with (sequences just finished, tokens just generated)."""


@dataclass
class DecodeStats:
    """What one :func:`decode` call computed: its cost in rows, not only its output."""

    steps: int = 0
    """Batched decode forwards."""
    row_steps: int = 0
    """Rows summed over decode forwards (one row = one sequence advanced one token)."""
    prefill_tokens: int = 0
    """Prompt tokens run through the model (each prompt once)."""
    generated_tokens: int = 0
    """Tokens kept in the outputs (each response up to its stop token)."""
    rows_per_step: list[int] = field(default_factory=list)


class SlotCache:
    """Per-layer KV buffers ``[slots, kv_heads, capacity, head_dim]``, one sequence per row.

    Duck-types the part of transformers' ``Cache`` that a decoder layer calls
    (``update``); the attention mask is passed in 4D, so the model never asks the cache
    for lengths.
    """

    def __init__(
        self,
        n_layers: int,
        slots: int,
        kv_heads: int,
        head_dim: int,
        dtype: Any,
        device: Any,
        max_columns: int | None = None,
    ) -> None:
        import torch

        self.n_layers, self.slots = n_layers, slots
        self.max_columns = max_columns
        self.shape = (slots, kv_heads, 0, head_dim)
        self.dtype, self.device = dtype, device
        self.keys = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(self.shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.live = 0
        self.width = 0
        self._rows: Any = None
        self._cols: Any = None

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2])

    def reserve(self, columns: int) -> None:
        """Make room for ``columns`` columns (grows by doubling, keeps the contents).

        New columns are zeros, not uninitialised memory: attention gives masked columns
        weight 0, and 0 x NaN garbage would still be NaN."""
        import torch

        if columns <= self.capacity:
            return
        new = max(columns, 2 * self.capacity)
        if self.max_columns is not None:  # doubling past the longest possible row wastes memory
            new = max(columns, min(new, self.max_columns))
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                grown = torch.zeros(
                    (self.slots, old.shape[1], new, old.shape[3]),
                    dtype=self.dtype,
                    device=self.device,
                )
                grown[:, :, : old.shape[2]] = old
                buffers[i] = grown

    def set_row(self, row: int, keys: Sequence[Any], values: Sequence[Any]) -> None:
        """Row ``row`` := a prompt's KV (per layer ``[kv_heads, length, head_dim]``)."""
        length = int(keys[0].shape[1])
        self.reserve(length + 1)
        for layer in range(self.n_layers):
            self.keys[layer][row, :, :length] = keys[layer]
            self.values[layer][row, :, :length] = values[layer]

    def move_row(self, src: int, dst: int, length: int) -> None:
        for layer in range(self.n_layers):
            self.keys[layer][dst, :, :length] = self.keys[layer][src, :, :length]
            self.values[layer][dst, :, :length] = self.values[layer][src, :, :length]

    def prepare(self, lengths: Any) -> None:
        """Before a decode step over rows ``0 .. len(lengths)-1``: row i writes at column
        ``lengths[i]`` and attention spans ``max(lengths) + 1`` columns."""
        import torch

        self.live = int(lengths.shape[0])
        self.width = int(lengths.max()) + 1
        self.reserve(self.width)
        self._rows = torch.arange(self.live, device=self.device)
        self._cols = lengths

    def update(
        self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self._rows, :, self._cols] = key_states[:, :, 0]
        values[self._rows, :, self._cols] = value_states[:, :, 0]
        return keys[: self.live, :, : self.width], values[: self.live, :, : self.width]


def draw_tokens(logits: Any, temperature: float, top_p: float, uniforms: Any) -> list[int]:
    """One token per row of ``logits`` ``[rows, vocab]``, from softmax(logits /
    temperature) restricted to the top-p nucleus, picked by inverting the cumulative
    distribution at ``uniforms`` ``[rows]`` (float64 in [0, 1)).

    The nucleus is transformers' ``TopPLogitsWarper``'s: tokens sorted by probability,
    those whose ascending cumulative probability is <= 1 - top_p removed, the most
    likely always kept. The cumulative sum runs in float64, and a token of zero
    probability is never picked.
    """
    import torch

    scores = logits.float() / temperature
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        remove = sorted_scores.softmax(-1).cumsum(-1) <= 1 - top_p
        remove[..., -1] = False
        scores = scores.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    cdf = scores.softmax(-1).cumsum(-1, dtype=torch.float64)
    total = cdf[:, -1:].contiguous()
    picked = torch.searchsorted(cdf, uniforms.unsqueeze(-1) * total, right=True)
    # u * total can round up to total: stay at the last token with positive probability.
    picked = torch.minimum(picked, torch.searchsorted(cdf, total, right=False))
    return [int(t) for t in picked.squeeze(-1).tolist()]


@dataclass
class _Prompt:
    keys: list[Any]
    values: list[Any]
    logits: Any
    waiting: int


def decode(
    model: Any,
    prompt_ids: list[list[int]],
    n: int,
    *,
    slots: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stop_ids: Sequence[int],
    seed: int,
    cache_arg: str = "past_key_values",
    last_logits_only: bool = True,
    on_step: StepCallback | None = None,
    stats: DecodeStats | None = None,
) -> list[list[int]]:
    """``n`` responses per prompt, prompt-major, each ending at its first stop token or
    after ``max_new_tokens`` tokens. ``temperature == 0`` is greedy."""
    decoder = _Decoder(
        model, prompt_ids, n, slots, max_new_tokens, temperature, top_p, stop_ids, seed,
        cache_arg, last_logits_only, stats if stats is not None else DecodeStats(),
    )  # fmt: skip
    return decoder.run(on_step)


class _Decoder:
    """The state of one :func:`decode` call: the slot cache, the queue of sequences waiting
    for a slot, the prompts whose KV is still to be copied, and rows 0 .. live-1 (live)."""

    def __init__(
        self, model: Any, prompt_ids: list[list[int]], n: int, slots: int, max_new_tokens: int,
        temperature: float, top_p: float, stop_ids: Sequence[int], seed: int, cache_arg: str,
        last_logits_only: bool, stats: DecodeStats,
    ) -> None:  # fmt: skip
        import torch

        self.model, self.prompt_ids, self.n, self.slots = model, prompt_ids, n, slots
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.cache_arg, self.stats = max_new_tokens, cache_arg, stats
        self.device = device = model.device
        config = model.config
        self.head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        longest = max((len(p) for p in prompt_ids), default=0) + max_new_tokens
        self.cache = SlotCache(
            config.num_hidden_layers, slots, self.kv_heads, self.head_dim, model.dtype, device,
            longest,
        )  # fmt: skip
        self.stop_set = set(int(s) for s in stop_ids)
        self.keep_last = {"logits_to_keep": 1} if last_logits_only else {}
        self.outputs: list[list[int]] = [[] for _ in range(len(prompt_ids) * n)]
        self.rngs = [
            np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(p, k)))
            for p in range(len(prompt_ids))
            for k in range(n)
        ]
        self.queue: deque[int] = deque(range(len(prompt_ids) * n))
        self.prompts: dict[int, _Prompt] = {}
        self.seq_of_row: list[int] = []
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        self.last = torch.zeros(slots, dtype=torch.long, device=device)

    def draw(self, logits: Any, seqs: list[int]) -> list[int]:
        """The next token of each sequence ``seqs`` from its logits and its own stream."""
        import torch

        if self.temperature == 0:
            return [int(t) for t in logits.argmax(-1).tolist()]
        u = torch.tensor([self.rngs[s].random() for s in seqs], dtype=torch.float64)
        return draw_tokens(logits, self.temperature, self.top_p, u.to(logits.device))

    def prefill(self, p: int) -> _Prompt:
        """Prompt ``p`` run through the model once: its per-layer KV and last logits."""
        import torch
        from transformers import DynamicCache

        ids = torch.tensor([self.prompt_ids[p]], dtype=torch.long, device=self.device)
        kv = DynamicCache()
        out = self.model(input_ids=ids, use_cache=True, **{self.cache_arg: kv}, **self.keep_last)
        self.stats.prefill_tokens += ids.shape[1]
        layers: list[Any] = list(kv.layers)
        expected = (1, self.kv_heads, ids.shape[1], self.head_dim)
        if len(layers) != self.model.config.num_hidden_layers or any(
            tuple(getattr(layer, "keys", torch.empty(0)).shape) != expected for layer in layers
        ):
            raise NotImplementedError(
                f"{type(self.model).__name__}: continuous batching needs one full-attention KV "
                f"cache {expected} per layer; use HFSampler(..., engine='generate')"
            )
        return _Prompt(
            [layer.keys[0] for layer in layers],
            [layer.values[0] for layer in layers],
            out.logits[:, -1],
            self.n,
        )

    def finished(self, seq: int, token: int) -> bool:
        return token in self.stop_set or len(self.outputs[seq]) >= self.max_new_tokens

    def admit(self) -> tuple[int, int]:
        """Fill free rows from the queue, drawing each newcomer's first token from its
        prompt's logits; returns (sequences that finished on that token, tokens drawn)."""
        done = drawn = 0
        while self.queue and len(self.seq_of_row) < self.slots:
            seq = self.queue.popleft()
            p = seq // self.n
            prompt = self.prompts.get(p)
            if prompt is None:
                prompt = self.prompts[p] = self.prefill(p)
            # First tokens of all waiting samples of this prompt come from its logits.
            (token,) = self.draw(prompt.logits, [seq])
            self.outputs[seq].append(token)
            drawn += 1
            prompt.waiting -= 1
            if prompt.waiting == 0:
                del self.prompts[p]
            if self.finished(seq, token):
                done += 1
                continue
            row = len(self.seq_of_row)
            self.seq_of_row.append(seq)
            self.cache.set_row(row, prompt.keys, prompt.values)
            self.lengths[row] = len(self.prompt_ids[p])
            self.last[row] = token
        return done, drawn

    def step(self) -> list[int]:
        """One batched forward over the live rows; returns the rows that finished."""
        import torch

        live = len(self.seq_of_row)
        cols = self.lengths[:live]
        self.cache.prepare(cols)
        width = self.cache.width
        mask = (torch.arange(width, device=self.device) <= cols.unsqueeze(1))[:, None, None, :]
        out = self.model(
            input_ids=self.last[:live].unsqueeze(1),
            position_ids=cols.unsqueeze(1),
            attention_mask=mask,
            use_cache=True,
            **{self.cache_arg: self.cache},
        )
        self.stats.steps += 1
        self.stats.row_steps += live
        self.stats.rows_per_step.append(live)
        tokens = self.draw(out.logits[:, -1], self.seq_of_row)
        self.lengths[:live] += 1
        ended: list[int] = []
        for row, token in enumerate(tokens):
            seq = self.seq_of_row[row]
            self.outputs[seq].append(token)
            if self.finished(seq, token):
                ended.append(row)
            else:
                self.last[row] = token
        return ended

    def release(self, ended: list[int]) -> None:
        """Free finished rows by moving the last live row into each (highest first: a moved
        row is never a finished one)."""
        lengths, last, seq_of_row = self.lengths, self.last, self.seq_of_row
        for row in reversed(ended):
            tail = len(seq_of_row) - 1
            if row != tail:
                self.cache.move_row(tail, row, int(lengths[tail]))
                seq_of_row[row] = seq_of_row[tail]
                lengths[row] = lengths[tail]
                last[row] = last[tail]
            seq_of_row.pop()

    def run(self, on_step: StepCallback | None) -> list[list[int]]:
        """Decode until every sequence has ended; the outputs, prompt-major."""
        import torch

        # Eval mode while decoding: in train mode a gradient-checkpointed layer drops the
        # cache argument, which would silently decode without context.
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                done, drawn = self.admit()
                if on_step is not None and drawn:
                    on_step(done, drawn)
                while self.seq_of_row:
                    live = len(self.seq_of_row)
                    ended = self.step()
                    self.release(ended)
                    done, drawn = self.admit()
                    if on_step is not None:
                        on_step(len(ended) + done, live + drawn)
        finally:
            self.model.train(was_training)
        self.stats.generated_tokens += sum(len(o) for o in self.outputs)
        return self.outputs
