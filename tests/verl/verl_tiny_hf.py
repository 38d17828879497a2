"""A tiny, randomly initialised local Qwen2 checkpoint for the verl backend tests."""

from __future__ import annotations

from pathlib import Path

VOCAB = ["<pad>", "<eos>", "<unk>"] + [chr(c) for c in range(32, 127)]


def make_tiny_qwen2(out: Path, seed: int = 0, shard_size: str | None = None) -> Path:
    """Save a 2-layer Qwen2ForCausalLM (float32, random init) plus a word-level tokenizer to ``out``."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(VOCAB), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False, torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config).eval()
    # Norm gains start at 1; perturb them so a wrong UAQ mapping cannot cancel out.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    fast.save_pretrained(out)
    return out
