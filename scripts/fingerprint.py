"""Fingerprint a few short embedded runs, to show that a refactor changed no numerics.

    # at the old revision, then at the new one (each in its own checkout):
    PYTHONPATH=/path/to/old python scripts/fingerprint.py run --out /tmp/fp-old
    PYTHONPATH=/path/to/new python scripts/fingerprint.py run --out /tmp/fp-new
    python scripts/fingerprint.py compare /tmp/fp-old /tmp/fp-new

`run` trains each cell of CELLS for a few steps in a fresh run directory, with a fresh
warm-start cache and MLflow store, and writes one JSON file per cell: the SHA-256 of every
logged step's metrics (except wall-clock ones: timing_s/*, perf/*, the warm start's seconds) and of every tensor of the
final checkpoint (actor, optimizer moments, critic, RNG states). The cells cover every
correction mode, algorithm and precision, QaRL's aligned forward, a reference model and the UAQ
control, so a bit-identical comparison says that rollouts (their log-probs, rewards and lengths
are metrics), losses and the updates they produced are unchanged.

`compare` prints one line per cell and exits 1 on any difference, naming the first step and
key (or checkpoint tensor) that differs.

Fingerprints are of one machine's numerics: compare two revisions on the same machine, with the
same CPU flags (docs/architecture.md, "Hardware choices").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

# Every cell starts from the same tiny warm start (the cache key omits the run's axes).
COMMON = [
    "model=tiny", "task.difficulty=1", "task.n_eval=16", "steps=3", "eval_every=3", "ckpt_every=3",
    "rollout.prompts_per_step=4", "algo.group_size=4", "warm_start.steps=60", "warm_start.batch_size=16",
    "threads=1",
]
CELLS = {
    "grpo-int8-acr-uaq": [],
    "grpo-fp8-tis": ["quant=fp8", "correction=tis", "uaq.s=1.0"],
    "grpo-w4a16-tbpo-aligned": ["quant=w4a16", "correction=tbpo", "correction.aligned_forward=true", "uaq.s=1.0"],
    "ppo-bf16-naive": ["algo=ppo", "quant=bf16", "correction=naive", "uaq.s=1.0"],
    "dapo-int8-bypass": ["algo=dapo", "correction=bypass", "algo.overlong_buffer=8", "uaq.s=1.0"],
    "grpo-fp32-kl-ref": ["quant=fp32", "correction=naive", "algo.kl_coef=0.01", "uaq.s=1.0"],
    "grpo-int8-acr-group-lr": ["uaq.s=1.0", "uaq.group_lr_s=1.5"],
}
WALL_CLOCK = ("timing_s/", "perf/", "warm_start/sft_seconds")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def _tensor_digests(state, prefix: str = "") -> dict[str, str]:
    """SHA-256 of the bytes of every tensor in a nested checkpoint state, keyed by its path."""
    import torch

    out: dict[str, str] = {}
    if isinstance(state, torch.Tensor):
        t = state.detach().cpu().contiguous().reshape(-1)
        out[prefix] = (f"{state.dtype}{list(state.shape)}:"
                       + hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16])
    elif isinstance(state, dict):
        for k in sorted(state, key=str):
            out.update(_tensor_digests(state[k], f"{prefix}/{k}"))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(_tensor_digests(v, f"{prefix}/{i}"))
    elif state is not None:
        out[prefix] = repr(state)
    return out


def run_cells(out: str, only: list[str] | None, keep: bool = False) -> None:
    root = tempfile.mkdtemp(prefix="suite-fp-")
    try:
        _run_cells(root, out, only)
    finally:
        if keep:
            print(f"run directories kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _run_cells(root: str, out: str, only: list[str] | None) -> None:
    os.environ["SUITE_CACHE"] = os.path.join(root, "cache")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{root}/mlflow.db"
    from suite.config import compose_config
    from suite.embedded.trainer import EmbeddedRun
    from suite.tracking.checkpoint import load_latest_checkpoint
    from suite.tracking.loggers import read_jsonl

    os.makedirs(out, exist_ok=True)
    for name, overrides in CELLS.items():
        if only and name not in only:
            continue
        cfg = compose_config(COMMON + overrides)
        run_dir = os.path.join(root, name)
        EmbeddedRun(cfg, run_dir, progress=False).run()
        steps = {}
        for rec in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
            values = {k: v for k, v in rec["metrics"].items() if not k.startswith(WALL_CLOCK)}
            steps[str(rec["step"])] = {k: _digest(v) for k, v in values.items()}
        step, state = load_latest_checkpoint(run_dir)
        # Python's and numpy's global streams are seeded by the OS in each process and never drawn
        # from by a run (its streams are torch's global one and rng/generators): not numerics.
        for unseeded in ("python", "numpy"):
            state["rng"].pop(unseeded, None)
        record = {"cell": name, "overrides": overrides, "metrics": steps, "checkpoint_step": step,
                  "checkpoint": _tensor_digests(state)}
        with open(os.path.join(out, f"{name}.json"), "w") as fh:
            json.dump(record, fh, indent=1, sort_keys=True)
        print(f"{name}: {len(steps)} logged steps, {len(record['checkpoint'])} checkpoint entries", flush=True)


def _first_difference(a: dict, b: dict) -> str | None:
    for step in sorted(set(a["metrics"]) | set(b["metrics"]), key=lambda s: int(s) if s.lstrip("-").isdigit() else -1):
        ma, mb = a["metrics"].get(step), b["metrics"].get(step)
        if ma is None or mb is None:
            return f"step {step} logged by one side only"
        for k in sorted(set(ma) | set(mb)):
            if ma.get(k) != mb.get(k):
                return f"step {step}: {k}"
    for k in sorted(set(a["checkpoint"]) | set(b["checkpoint"])):
        if a["checkpoint"].get(k) != b["checkpoint"].get(k):
            return f"checkpoint {k}"
    return None


def compare(old: str, new: str) -> int:
    names = sorted(set(os.listdir(old)) | set(os.listdir(new)))
    bad = 0
    for fn in names:
        try:
            with open(os.path.join(old, fn)) as fh:
                a = json.load(fh)
            with open(os.path.join(new, fn)) as fh:
                b = json.load(fh)
        except FileNotFoundError:
            print(f"{fn}: present on one side only")
            bad += 1
            continue
        diff = _first_difference(a, b)
        n_keys = sum(len(m) for m in a["metrics"].values())
        print(f"{a['cell']}: " + (f"DIFFERENT at {diff}" if diff else
                                   f"bit-identical ({n_keys} metric values, "
                                   f"{len(a['checkpoint'])} checkpoint entries)"))
        bad += diff is not None
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train the cells with the suite on PYTHONPATH, write fingerprints")
    r.add_argument("--out", required=True)
    r.add_argument("--cells", nargs="*", choices=sorted(CELLS), help="a subset of the cells (default: all)")
    r.add_argument("--keep", action="store_true", help="keep the run directories (their path is printed)")
    c = sub.add_parser("compare", help="compare two fingerprint directories")
    c.add_argument("old")
    c.add_argument("new")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        run_cells(args.out, args.cells, args.keep)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
