"""Benchmark (not a test): expand and validate a generated 1,000-cell sweep.

    python -m suite.sweep.bench            # 1,000 cells; compares 10 cells with compose_config
    python -m suite.sweep.bench --cells 200 --compare 20

Prints the wall time of `load_sweep` (expansion + composition + validation + run ids, what
`suite sweep --dry-run` does before printing) and, for a sample of cells, the time of the
plain `compose_config` path and whether both give identical configs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import yaml

from suite.core.quant import QUANTIZERS


def make_file(path: str, n_cells: int) -> int:
    """A sweep of about `n_cells` cells: 4 precisions x 2 corrections x 5 UAQ scales x seeds."""
    n_seeds = max(1, round(n_cells / 40))
    data = {
        "name": "bench",
        "base": ["model=tiny", "steps=10", f"out_dir={os.path.dirname(path)}/runs"],
        "matrix": {
            "quant": [n for n, q in QUANTIZERS.items() if not q.lossless],  # every quantized precision
            "correction": ["tis", "acr"],
            "uaq.s": [1.0, 1.25, 1.5, 1.75, 2.0],
            "seed": list(range(n_seeds)),
        },
    }
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return 40 * n_seeds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=1000, help="cells to generate (rounded to a multiple of 40)")
    ap.add_argument("--compare", type=int, default=10, help="cells also composed with compose_config")
    args = ap.parse_args(argv)

    from omegaconf import OmegaConf

    from suite.config import compose_config
    from suite.sweep import compose as fast
    from suite.sweep.spec import load_sweep

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.yaml")
        n = make_file(path, args.cells)
        t0, c0 = time.perf_counter(), time.process_time()
        sweep = load_sweep(path)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        # CPU time too: on a shared machine the wall time mostly measures the neighbours
        print(f"{len(sweep.cells)} cells expanded, composed and validated in {wall:.1f} s wall, {cpu:.1f} s CPU "
              f"({1000 * wall / n:.1f} ms/cell; {len(fast._BASE_CACHE)} Hydra composes for the distinct group choices)",
              flush=True)
        step = max(1, len(sweep.cells) // max(1, args.compare))
        sample = sweep.cells[::step][: args.compare]
        t0, c0 = time.perf_counter(), time.process_time()
        same = 0
        for c in sample:
            ref = compose_config(c.overrides)
            same += OmegaConf.to_yaml(ref) == OmegaConf.to_yaml(c.cfg)
        per = (time.perf_counter() - t0) / max(1, len(sample))
        per_cpu = (time.process_time() - c0) / max(1, len(sample))
        print(f"compose_config: {1000 * per:.0f} ms/cell wall, {1000 * per_cpu:.0f} ms CPU (a {n}-cell sweep "
              f"would take ~{per * n:.0f} s wall, {per_cpu * n:.0f} s CPU); "
              f"identical configs: {same}/{len(sample)}", flush=True)
    return 0 if same == len(sample) else 1


if __name__ == "__main__":
    raise SystemExit(main())
