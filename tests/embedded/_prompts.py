"""Random left-padded prompt batches shared by the model and engine tests."""

from __future__ import annotations

import torch

VOCAB = 80  # token ids drawn below this; ids 0-2 are the tokenizer's specials


def left_padded(prompts: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    P = max(map(len, prompts))
    tokens = torch.tensor([[pad] * (P - len(p)) + p for p in prompts])  # [B, P]
    mask = torch.tensor([[False] * (P - len(p)) + [True] * len(p) for p in prompts])  # [B, P]
    return tokens, mask


def rand_prompts(lengths: list[int], seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
