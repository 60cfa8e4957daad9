"""The logits a causal LM gives each token of sampled responses, as sampled: the one
forward pass that training's policy update and the full-model score sketch both take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def autocast_dtype(autocast: str) -> Any:
    """The torch dtype of the forward-pass precision ``autocast``; None for "none"."""
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(autocast)


def response_logits(
    model: Any,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[np.ndarray],
    pad_id: int,
    temperature: float,
    autocast: str = "none",
) -> tuple[Any, Any, Any]:
    """The logits that score each sampled response token, divided by the sampling
    temperature (N, T, V), the tokens (N, T) and their mask (N, T).

    Prompts are left-padded to one width W and responses right-padded after them, so every
    response starts at column W as in generation; position ids count real tokens only.
    Only the last T + 1 positions go through the LM head (prompt logits are never needed).
    """
    import torch

    n, width = len(prompts), max(len(p) for p in prompts)
    t = max(1, max(len(r) for r in responses))
    ids = torch.full((n, width + t), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width + t), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ids[i, width - len(p) : width] = torch.as_tensor(p, dtype=torch.long)
        ids[i, width : width + len(r)] = torch.as_tensor(r, dtype=torch.long)
        attention[i, width - len(p) : width + len(r)] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    device = model.device
    ids, attention, positions = ids.to(device), attention.to(device), positions.to(device)
    precision = autocast_dtype(autocast)
    with torch.autocast(device.type, dtype=precision, enabled=precision is not None):
        out = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=t + 1,
        )
    logits = out.logits[:, :-1].float() / temperature
    return logits, ids[:, width:], attention[:, width:].to(logits.dtype)
