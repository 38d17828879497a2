"""`suite bench`: speed measured honestly on the machine it runs on (docs/bench.md).

    suite bench rollout     # decode tokens/s per precision x model x batch, weight-sync time
    suite bench step        # one RL step split into sync / gen / prox log-probs / train, per precision
    suite bench peer        # our engine vs Hugging Face `generate`, same weights, batch, dtype
    suite bench gpu         # INT8 / FP8 GEMMs vs bf16 at 7B / 32B shapes (needs CUDA)
    suite bench vllm        # vLLM rollout tokens/s: bf16 vs INT8 / per-channel FP8 / W4A16 (its serving kernels)

Every ratio is measured side by side in one process, interleaved, after warm-up, median of
repeats; each benchmark prints a table (or `--json` rows) and logs one MLflow run with the
table as an artifact. `suite bench gpu` also runs without the suite installed:
`python suite/bench/gpu.py` needs torch alone. Benchmarks that serve the suite's own
development (orchestration overheads, the report's MLflow reads) are in benchmarks/, not installed.
"""

# Each subcommand imports torch and friends inside its function, so `suite -h` stays fast.

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    """Add the `bench` verb and its subcommands to the `suite` CLI."""
    from suite.bench import gpu, peer, rollout, step, vllm_bench

    p = subparsers.add_parser("bench", help="benchmarks: rollout, step, peer, gpu, vllm",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="bench", required=True)
    for module in (rollout, step, peer, gpu, vllm_bench):
        module.register(sub)
