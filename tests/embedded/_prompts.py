"""Random left-padded prompt batches shared by the model and engine tests, and the KV-cache check
of the engine's decode and prefill tests."""

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


def same_values(fast, general) -> None:
    """The engine's cache holds exactly the reference cache's values over the filled slots: the
    same tensors, or (a float32 cache of bf16 attention: RolloutEngine.cache_dtype) the bf16
    values themselves, each exactly representable (equal to the widened reference)."""
    n = general.length
    assert fast.length == n
    for a, b in ((fast.k, general.k), (fast.v, general.v)):
        assert torch.equal(a[:, :, :, :n], b[:, :, :, :n].to(a.dtype))
    assert torch.equal(fast.key_valid, general.key_valid) and torch.equal(fast.n_valid, general.n_valid)
