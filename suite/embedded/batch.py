"""Sequence layout shared by the warm start, the rollout engine's callers and the trainer.

A batch is left-padded prompts followed by right-padded responses (docs/architecture.md):
``tokens [B, P + R]``, ``attention_mask [B, P + R]``, responses start at column ``P``.
"""

from __future__ import annotations

import torch


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Left-pad prompts to the longest, right-pad responses to the longest.

    Returns (tokens [B, P + R] long, attention_mask [B, P + R] bool, P).
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    p_len = max(len(p) for p in prompts)
    r_len = max(1, max(len(r) for r in responses))
    batch = len(prompts)
    tokens = torch.full((batch, p_len + r_len), pad_id, dtype=torch.long)  # [B, P + R]
    mask = torch.zeros((batch, p_len + r_len), dtype=torch.bool)  # [B, P + R]
    for i, (p, r) in enumerate(zip(prompts, responses)):
        tokens[i, p_len - len(p) : p_len] = torch.tensor(p, dtype=torch.long)
        mask[i, p_len - len(p) : p_len] = True
        if r:
            tokens[i, p_len : p_len + len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, p_len : p_len + len(r)] = True
    return tokens, mask, p_len


def repad(tokens: torch.Tensor, mask: torch.Tensor, start: int, p_len: int, r_len: int, pad_id: int):
    """Re-pad one packed batch to a wider prompt width ``p_len`` and response width ``r_len``.

    Used to concatenate rollouts generated in separate rounds (DAPO dynamic sampling).
    """
    batch = tokens.shape[0]
    old_p, old_r = start, tokens.shape[1] - start
    if p_len < old_p or r_len < old_r:
        raise ValueError(f"cannot shrink a batch from ({old_p}, {old_r}) to ({p_len}, {r_len})")
    out = torch.full((batch, p_len + r_len), pad_id, dtype=tokens.dtype)  # [B, P' + R']
    out_mask = torch.zeros((batch, p_len + r_len), dtype=torch.bool)  # [B, P' + R']
    out[:, p_len - old_p : p_len + old_r] = tokens
    out_mask[:, p_len - old_p : p_len + old_r] = mask
    return out, out_mask


def pad_right(x: torch.Tensor, width: int, value) -> torch.Tensor:
    """Pad the last dimension of ``x [B, R]`` on the right to ``width``."""
    if x.shape[-1] == width:
        return x
    pad = torch.full((*x.shape[:-1], width - x.shape[-1]), value, dtype=x.dtype)
    return torch.cat([x, pad], dim=-1)  # [B, width]
