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

from suite.embedded.model import ModelConfig, Transformer
from suite.embedded.tokenizer import CharTokenizer

D_MODEL, N_HEADS, N_LAYERS = 64, 2, 2  # head_dim 32: the smallest vLLM CPU serves
D_FF = 1024  # wide MLP: ~2 MB of float32 weights, more than one of verl's 1 MB sync buckets
MAX_SEQ_LEN = 128


def tiny_model(seed: int = 0, scale: float = 3.0) -> Transformer:
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
    """``model`` as a float32 HF ``LlamaForCausalLM`` checkpoint + the character tokenizer, as
    `suite export` writes them (suite.embedded.export.save_hf_model)."""
    from suite.embedded.export import save_hf_model

    return save_hf_model(model, CharTokenizer(), out)


W4_GROUP = 32  # the tiny model's 64-wide inputs hold two groups (vLLM's int4 layout needs whole groups)


def checkpoints(root: Path, seed: int = 0, fp8: bool = False, w4a16: bool = False) -> dict[str, Path]:
    """The tiny model (``seed``) as float32 HF checkpoint ``fp`` and its W8A8 INT8 copy ``int8``
    (with ``fp8``, also its per-channel FP8 copy ``fp8``; with ``w4a16``, its packed int4 W4A16 copy
    ``w4a16`` at group :data:`W4_GROUP`, symmetric)."""
    from suite.verl.w8a8_checkpoint import write_w8a8_checkpoint

    fp = save_hf(tiny_model(seed), root / f"fp{seed}")
    out = {"fp": fp, "int8": write_w8a8_checkpoint(fp, root / f"int8_{seed}")}
    if fp8:
        out["fp8"] = write_w8a8_checkpoint(fp, root / f"fp8_{seed}", rollout="fp8_per_channel")
    if w4a16:
        out["w4a16"] = write_w8a8_checkpoint(fp, root / f"w4a16_{seed}", "w4a16", W4_GROUP, True)
    return out


def engine(path: Path, dtype: str = "float32", **kw):
    """A vLLM engine in this process (eager: no compile time; seeded)."""
    from vllm import LLM

    return LLM(model=str(path), dtype=dtype, max_model_len=MAX_SEQ_LEN, enforce_eager=True, seed=0, max_num_seqs=8,
               **kw)


def sequences(n: int = 8, length: int = 36, seed: int = 0) -> list[list[int]]:
    """Random token sequences (``<bos>`` then characters) for teacher-forced log-probs."""
    g = torch.Generator().manual_seed(seed)
    tok = CharTokenizer()
    return [[tok.bos_id] + torch.randint(3, tok.vocab_size, (length - 1,), generator=g).tolist() for _ in range(n)]


def prompt_logprobs(llm, seqs: list[list[int]]) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t >= 1 of every sequence, from vLLM's prefill: [N, T-1]."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": s} for s in seqs], SamplingParams(max_tokens=1, prompt_logprobs=0),
                       use_tqdm=False)
    return torch.tensor([[lp[t].logprob for t, lp in zip(s[1:], o.prompt_logprobs[1:])] for s, o in zip(seqs, out)])


def rollout_logprobs(llm, prompts: list[list[int]], max_tokens: int = 8) -> list[tuple[list[int], list[float]]]:
    """Greedy rollouts: (tokens, their log-probs as vLLM reports them at decode) per prompt."""
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": p} for p in prompts],
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0), use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)])
            for o in out]


def torch_logprobs(forward, seqs: list[list[int]]) -> torch.Tensor:
    """The same as :func:`prompt_logprobs` from a PyTorch model: ``forward(tokens [1, T]) -> logits``."""
    rows = []
    with torch.no_grad():
        for s in seqs:
            x = torch.tensor([s])
            lp = torch.log_softmax(forward(x).float(), -1)[0, :-1]  # [T-1, V]
            rows.append(lp.gather(-1, x[0, 1:, None])[:, 0])  # [T-1]
    return torch.stack(rows)  # [N, T-1]


INT8_KERNELS = ("sgl-amx", "onednn-vnni", "onednn-saturating")


def int8_kernel() -> str:
    """The kernel vLLM's CPU build runs for a W8A8 INT8 linear on this CPU, chosen as vLLM chooses
    it (vllm/model_executor/kernels/linear/scaled_mm/cpu.py and layers/utils.py
    ``check_cpu_sgl_kernel`` at v0.31.0; docs/verl.md, "vLLM's CPU INT8 without VNNI"):

    - ``sgl-amx``: sgl-kernel's AMX GEMM (``int8_scaled_mm_with_quant``); bf16 / fp16 activations
      only, so a float32 engine cannot run an INT8 checkpoint there;
    - ``onednn-vnni``: oneDNN's s8 x s8 matmul with a VNNI dot product: exact int32 sums;
    - ``onednn-saturating``: the same without VNNI (AVX2-only CPUs): u8 x s8 product pairs summed in
      saturating int16 (``vpmaddubsw``), not W8A8 arithmetic.
    """
    from suite.hardware import cpu_features

    if torch.cpu._is_amx_tile_supported():
        return "sgl-amx"
    return "onednn-vnni" if cpu_features().int8_dot_exact else "onednn-saturating"


# Where vLLM's float32 engine cannot be used: on the AMX kind (an Intel Xeon with AMX, 2 vCPUs) the
# AVX-512 kernel libraries (vllm._C, vllm._C_AVX512) corrupt the heap in a float32 prefill of 8 x 36
# tokens in 8 of 10 runs (glibc: "double free or corruption" / "free(): invalid next size"), under every
# oneDNN cap; its AVX2 library (SUITE_VLLM_CPU_EMULATE) did not in 5 of 5, nor did the AVX-512 one on an
# AVX-512 VNNI/BF16 EPYC without AMX (docs/verl.md, "vLLM's CPU build on each CPU kind").
FP32_ENGINE_BROKEN = ("vLLM's AVX-512 kernel library corrupts the heap in float32 prefills on AMX CPUs "
                      "(docs/verl.md)") if torch.cpu._is_amx_tile_supported() else ""

NUMBERS: list[str] = []  # measured values the tests report; printed at the end of the run (conftest.py)


def w8a8_reference(model: Transformer, scheme=None) -> Transformer:
    """A copy of ``model`` whose block linears compute W8A8 by the suite's quantizers
    (suite.core.quant), the rest as ``model`` does (float32): the INT8 arithmetic of the engine
    and of vLLM's int8 checkpoint without their bf16 rounding (or, with ``scheme`` FP8 per
    channel, QuRL's FP8: per-channel E4M3 weights, per-token E4M3 activations)."""
    import copy

    import torch.nn.functional as F

    from suite.core.quant import QuantScheme, fake_quant, fake_quant_act

    scheme = scheme or QuantScheme(precision="int8")

    class W8A8(torch.nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.w = fake_quant(lin.weight.detach(), scheme)

        def forward(self, x):
            return F.linear(fake_quant_act(x, scheme), self.w)

    ref = copy.deepcopy(model)
    for block in ref.layers:
        for parent, names in ((block.attn, ("wq", "wk", "wv", "wo")), (block.mlp, ("w_gate", "w_up", "w_down"))):
            for n in names:
                setattr(parent, n, W8A8(getattr(parent, n)))
    return ref
