"""Sequence layout shared by the warm start, the rollout engine's callers and the trainer.

A batch is left-padded prompts followed by right-padded responses (docs/architecture.md):
``tokens [B, P + R]``, ``attention_mask [B, P + R]``, responses start at column ``P``.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class Batch:
    """One step's rollouts, packed (docs/architecture.md layout)."""

    tokens: torch.Tensor  # [N, P + R] long
    attention_mask: torch.Tensor  # [N, P + R] bool
    start: int  # P
    response_mask: torch.Tensor  # [N, R] float
    behav_logp: torch.Tensor  # [N, R]
    scores: torch.Tensor  # [N] reward after shaping
    correct: torch.Tensor  # [N] 0/1 verifier outcome
    lengths: torch.Tensor  # [N] response tokens
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without the stop token


def concat_batches(batches: list[Batch], pad_id: int) -> Batch:
    if len(batches) == 1:
        return batches[0]
    p_len = max(b.start for b in batches)
    r_len = max(b.response_mask.shape[1] for b in batches)
    toks, masks = zip(*(repad(b.tokens, b.attention_mask, b.start, p_len, r_len, pad_id) for b in batches))
    return Batch(
        tokens=torch.cat(toks),
        attention_mask=torch.cat(masks),
        start=p_len,
        response_mask=torch.cat([pad_right(b.response_mask, r_len, 0.0) for b in batches]),
        behav_logp=torch.cat([pad_right(b.behav_logp, r_len, 0.0) for b in batches]),
        scores=torch.cat([b.scores for b in batches]),
        correct=torch.cat([b.correct for b in batches]),
        lengths=torch.cat([b.lengths for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]),
    )


def select_rows(b: Batch, idx: torch.Tensor) -> Batch:
    return Batch(
        tokens=b.tokens[idx], attention_mask=b.attention_mask[idx], start=b.start,
        response_mask=b.response_mask[idx], behav_logp=b.behav_logp[idx], scores=b.scores[idx],
        correct=b.correct[idx], lengths=b.lengths[idx], truncated=b.truncated[idx],
    )
