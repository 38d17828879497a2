"""Benchmark (not a test): `suite status` of a launched 100-cell sweep, in a fresh process, with
two checkouts of the suite side by side.

    git -C . archive <commit> | tar -x -C /tmp/before        # the suite to compare with
    python -m suite.sweep.status_bench --before /tmp/before  # this checkout vs that one
    python -m suite.sweep.status_bench --before /tmp/before --done   # every cell finished

The sweep's state dir is written as `suite sweep` writes it before submitting (`load_sweep`,
`write_state_files`, the MLflow parent run) by this checkout; `--done` also gives every cell a
summary.json and ends the parent run FINISHED as the driver does, so status looks at the parent's
status (which the checkout before asks MLflow for). Then `python -m suite.cli status
FILE` runs with each checkout on PYTHONPATH in interleaved rounds (suite.bench.common.interleaved);
the medians, the children's CPU time and their ratio are printed, and both outputs must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from suite.bench.common import interleaved, median, spread

SWEEP = """name: status-bench
base: [model=tiny, steps=10, out_dir={out}]
matrix:
  quant: [int8, fp8, w4a16, bf16]
  correction: [tis, acr]
  uaq.s: [1.0, 1.25, 1.5, 1.75, 2.0]
  seed: [0, 1, 2]
exclude:
  - {{seed: 2, correction: tis}}
"""  # 4 x 2 x 5 x 3 = 120 cells, minus the 20 of seed 2 with tis: 100

LAUNCH = """
import json, sys
from pathlib import Path
from suite.sweep.parent import parent_run, set_parent_status
from suite.sweep.spec import load_sweep
from suite.sweep.states import write_state_files
sweep = load_sweep(sys.argv[1])
write_state_files(sweep)
parent_run(sweep)
if sys.argv[2] == "done":
    for c in sweep.cells:
        Path(c.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(c.run_dir) / "summary.json").write_text(json.dumps({"baseline_acc": 0.5, "final_acc": 0.6}))
    set_parent_status(sweep, "FINISHED")  # what the driver does once every cell is done
print(len(sweep.cells))
"""


def _env(tree: str, tmp: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": tree, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
            "SUITE_CACHE": f"{tmp}/cache"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the suite checkout to compare with (a directory holding suite/)")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds (each runs both once)")
    ap.add_argument("--done", action="store_true", help="every cell finished: status also reads the parent run")
    args = ap.parse_args(argv)
    after = str(Path(__file__).resolve().parents[2])
    trees = {"before": os.path.abspath(args.before), "after": after}
    if not (Path(trees["before"]) / "suite" / "cli.py").is_file():
        ap.error(f"--before {args.before}: no suite/cli.py there")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(SWEEP.format(out=f"{tmp}/runs"))
        n = subprocess.run([sys.executable, "-c", LAUNCH, str(path), "done" if args.done else "missing"],
                           env=_env(after, tmp), cwd=tmp, check=True, capture_output=True, text=True).stdout.split()[-1]
        outputs: dict[str, set[str]] = {k: set() for k in trees}
        cpu: dict[str, list[float]] = {k: [] for k in trees}

        def status(name: str):
            def run() -> None:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                out = subprocess.run([sys.executable, "-m", "suite.cli", "status", str(path)], env=_env(trees[name], tmp),
                                     cwd=tmp, capture_output=True, text=True)
                used = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu[name].append(used.ru_utime + used.ru_stime - before.ru_utime - before.ru_stime)
                outputs[name].add(f"rc {out.returncode}\n{out.stdout}")
            return run

        times = interleaved({k: status(k) for k in trees}, repeats=args.repeats, warmup=1)
    load = os.getloadavg()[0]
    print(f"suite status of a launched {n}-cell sweep ({'every cell done' if args.done else 'no cell run yet'}), "
          f"fresh process, median of {args.repeats} interleaved rounds; load average {load:.2f} at the end")
    for k in trees:
        print(f"  {k:<6} {median(times[k]):6.3f} s wall (spread {spread(times[k]):.2f}), "
              f"{median(cpu[k][1:]):6.3f} s CPU   {trees[k]}")
    print(f"  ratio before/after: {median(times['before']) / median(times['after']):.1f}x wall, "
          f"{median(cpu['before'][1:]) / median(cpu['after'][1:]):.1f}x CPU")
    same = len(outputs["before"]) == 1 and outputs["before"] == outputs["after"]
    print(f"  outputs identical: {'yes' if same else 'NO'}")
    if not same:
        print(json.dumps({k: sorted(v) for k, v in outputs.items()}, indent=1)[:4000])
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
