"""The tiny model of the real-vLLM tests: the embedded backend's decoder, saved as a HF Llama.

vLLM's CPU attention needs head_dim in {32, 64, 80, ...}: hidden 64 with 2 heads (head_dim 32)
is the smallest that serves. The same weights run in the embedded engine
(suite.embedded.model.Transformer) and, through suite.embedded.model.to_hf_llama, in vLLM, so
the parity test compares one network on two engines. The tokenizer is the suite's character
tokenizer as a Hugging Face fast tokenizer (same ids).
"""

from __future__ import annotations

from pathlib import Path

import torch

from suite.embedded.model import ModelConfig, Transformer, to_hf_llama
from suite.embedded.tokenizer import CharTokenizer

D_MODEL, N_HEADS, N_LAYERS = 64, 2, 2  # head_dim 32: the smallest vLLM CPU serves
D_FF = 1024  # wide MLP: ~2 MB of float32 weights, more than one of verl's 1 MB sync buckets
MAX_SEQ_LEN = 128


def tiny_model(seed: int = 0, scale: float = 6.0) -> Transformer:
    """A random decoder whose logits are far from uniform (linears x ``scale`` over the 0.02 init;
    norm gains in [0.5, 1.5] so that a wrong UAQ mapping cannot cancel)."""
    torch.manual_seed(seed)
    tok = CharTokenizer()
    m = Transformer(ModelConfig(vocab_size=tok.vocab_size, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS,
                                d_ff=D_FF, max_seq_len=MAX_SEQ_LEN))
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name != "tok_emb.weight":
                p.mul_(scale)
    return m.eval()


def save_hf(model: Transformer, out: Path) -> Path:
    """``model`` as a float32 HF ``LlamaForCausalLM`` checkpoint + the character tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    kw, sd = to_hf_llama(model)
    tok = CharTokenizer()
    hf = LlamaForCausalLM(LlamaConfig(**kw, torch_dtype="float32", bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
                                      pad_token_id=tok.pad_id))
    hf.load_state_dict(sd)
    hf.save_pretrained(out, safe_serialization=True)
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tok.itos)}, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                            unk_token="<pad>").save_pretrained(out)
    return out
