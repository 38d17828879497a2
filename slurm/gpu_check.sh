#!/usr/bin/env bash
# GPU check of the verl backend's INT8 rollout path (suite.verl.int8_hook), one prepared script.
#
#   bash slurm/gpu_check.sh                 # on a GPU node (or: srun -N1 --gres=gpu:1 bash slurm/gpu_check.sh)
#
# Needs: a CUDA GPU, the suite installed with the gpu extra (pip install -e '.[gpu]': verl + vLLM).
# Takes ~2-4 min (vLLM start-up dominates). Prints one "CHECK name: PASS|FAIL|SKIP detail" line per
# check and exits non-zero if any check failed:
#   1. cuda            a CUDA device is visible to torch
#   2. requant         suite.verl.int8_hook.requantize_int8 on the GPU equals the CPU quantizer
#                      (suite.core.quant.quantize_int8_per_channel) bit for bit
#   3. vllm_int8_load  vLLM builds a tiny random Qwen2 with the compressed-tensors W8A8 INT8 config
#                      of suite.verl.translate (dummy weights), the suite worker extension loads the
#                      bf16 weights through load_int8_weights twice (a second sync must reuse the
#                      live tensors), and the int8 codes in vLLM equal the suite quantizer's
#   4. vllm_generate   the INT8 engine generates, and its token log-probs are close to a bf16 engine's
#                      on the same weights (mean |dlogp| printed; INT8 noise, not garbage)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export VLLM_ENABLE_V1_MULTIPROCESSING=0   # keep the engine in this process: collective_rpc gets our objects
export TOKENIZERS_PARALLELISM=false
exec "$PY" - <<'PY'
import json, os, sys, tempfile, time, traceback
results = []

def check(name, fn):
    t = time.time()
    try:
        detail = fn()
        results.append((name, "PASS", f"{detail} ({time.time() - t:.1f} s)"))
    except SkipCheck as e:
        results.append((name, "SKIP", str(e)))
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        traceback.print_exc()
        results.append((name, "FAIL", f"{type(e).__name__}: {e}"))
    print(f"CHECK {results[-1][0]}: {results[-1][1]} {results[-1][2]}", flush=True)

class SkipCheck(Exception):
    pass

import torch

def cuda():
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"

def requant():
    from suite.core.quant import quantize_int8_per_channel
    from suite.verl.int8_hook import requantize_int8
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 512, generator=g, dtype=torch.float32).to(torch.bfloat16)
    out = dict(requantize_int8([("model.layers.0.mlp.up_proj.weight", w.cuda()), ("model.norm.weight", w[0].cuda())]))
    codes, scales = quantize_int8_per_channel(w.float())
    got_c = out["model.layers.0.mlp.up_proj.weight"].cpu()
    got_s = out["model.layers.0.mlp.up_proj.weight_scale"].cpu()
    n_s, n_c = int((got_s != scales.float()).sum()), int((got_c != codes).sum())
    # (measured on an H200, torch 2.11: CUDA computes `amax / 127` as amax * (1/127), so a few
    # scales differ by 1 ulp and a few codes by 1 unless suite.core.quant divides by a tensor)
    assert n_s == 0 and n_c == 0, f"GPU vs CPU quantizer: {n_s}/{got_s.numel()} scales and {n_c}/{got_c.numel()} codes differ"
    assert torch.equal(out["model.norm.weight"].cpu(), w[0]), "a norm weight was changed"
    return f"codes and scales equal on {tuple(w.shape)}"

state = {}

def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers
    d = tempfile.mkdtemp(prefix="suite_gpu_check_")
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, torch_dtype="bfloat16")
    m = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    m.save_pretrained(d, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(512)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1", pad_token="t0", unk_token="t0").save_pretrained(d)
    return d, list(m.state_dict().items())

def vllm_int8_load():
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise SkipCheck("vLLM is not installed (pip install -e '.[gpu]')")
    from vllm import LLM
    from suite.verl.translate import W8A8_QUANT_CONFIG  # the exact config the translator passes
    from suite.core.quant import quantize_int8_per_channel
    hf_overrides = {"quantization_config": W8A8_QUANT_CONFIG}
    path, weights = tiny_model()
    state["path"], state["weights"] = path, weights
    llm = LLM(model=path, quantization="compressed-tensors", hf_overrides=hf_overrides, load_format="dummy",
              dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=False, max_model_len=256,
              worker_extension_cls="suite.verl.int8_hook.QuantizedWeightSyncExtension")
    os.environ["SUITE_ROLLOUT_QUANT"] = "int8"

    def sync_and_read(ext_self, ws):
        # verl's update_weights_from_ipc without the IPC transport: stage, load (our
        # _update_weights re-quantizes), vLLM's post-load processing once, fold into the live tensors
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
        from suite.verl.int8_hook import finish_sync, stage_for_loading
        model = ext_self.model_runner.model
        staged = stage_for_loading(model)
        ext_self._update_weights(ws, None, False)
        process_weights_after_loading(model, ext_self.model_runner.vllm_config.model_config, ext_self.device)
        finish_sync(staged)
        layer = ext_self.model_runner.model.model.layers[0].mlp.down_proj
        return layer.weight.data_ptr(), layer.weight.detach().cpu().clone()

    ptr1, w1 = llm.collective_rpc(sync_and_read, args=(weights,))[0]
    ptr2, w2 = llm.collective_rpc(sync_and_read, args=(weights,))[0]
    assert ptr1 == ptr2, "the second sync replaced the live weight tensor (CUDA graphs would read stale memory)"
    ref, _ = quantize_int8_per_channel(dict(weights)["model.layers.0.mlp.down_proj.weight"].float())
    got = w1 if w1.shape == ref.shape else w1.t()
    assert torch.equal(got, ref), "vLLM's int8 codes differ from suite.core.quant"
    state["llm"] = llm
    return f"2 syncs, live tensor kept, codes equal ({tuple(ref.shape)}, layout {tuple(w1.shape)})"

def vllm_generate():
    if "llm" not in state:
        raise SkipCheck("needs vllm_int8_load")
    from vllm import LLM, SamplingParams
    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9, 10]}, {"prompt_token_ids": [100, 200, 300]}]
    sp = SamplingParams(temperature=0.0, max_tokens=16, logprobs=0)
    out8 = state["llm"].generate(prompts, sp)
    del state["llm"]
    torch.cuda.empty_cache()
    ref = LLM(model=state["path"], dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=256)
    diffs = []
    for o in out8:
        toks = list(o.outputs[0].token_ids)
        assert len(toks) > 0, "INT8 engine generated nothing"
        sp_ref = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
        r = ref.generate([{"prompt_token_ids": list(o.prompt_token_ids) + toks}], sp_ref)[0]
        n = len(o.prompt_token_ids)
        for i, (t, lp8) in enumerate(zip(toks, o.outputs[0].logprobs)):
            diffs.append(abs(lp8[t].logprob - r.prompt_logprobs[n + i][t].logprob))
    mean = sum(diffs) / len(diffs)
    assert mean < 0.5, f"mean |logp_int8 - logp_bf16| = {mean:.3f}: INT8 rollout is not close to bf16"
    return f"{len(diffs)} tokens, mean |logp_int8 - logp_bf16| = {mean:.4f}"

check("cuda", cuda)
if results[-1][1] == "PASS":
    check("requant", requant)
    check("vllm_int8_load", vllm_int8_load)
    check("vllm_generate", vllm_generate)
failed = [r for r in results if r[1] == "FAIL"]
print(json.dumps({"checks": [{"name": n, "status": s, "detail": d} for n, s, d in results]}, indent=1))
sys.exit(1 if failed or results[0][1] != "PASS" else 0)
PY
