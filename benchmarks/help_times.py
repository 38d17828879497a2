"""`suite VERB -h` wall time per verb, in fresh processes on this machine: cold (an empty cache, so the
config-group listing is composed: torch, Hydra) and warm (the listing read from the cache, as every later
`-h` is). Prints one line per verb and the slowest of each. Target: warm under 2 s (issue 59).

    python benchmarks/help_times.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

VERBS = ("run", "sync", "uaq", "sweep", "status", "cancel", "tune", "bench", "report", "data", "export", "eval")


def _time(verb: str, env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "suite.cli", verb, "-h"], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"suite {verb} -h exited {proc.returncode}: {proc.stderr[-400:]}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="warm timings per verb (the median is printed)")
    args = ap.parse_args()
    cold, warm = {}, {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        for verb in VERBS:
            cold[verb] = _time(verb, env)  # the first verb to list groups composes them; later ones read the cache
        for verb in VERBS:
            warm[verb] = sorted(_time(verb, env) for _ in range(args.repeats))[args.repeats // 2]
    print(f"{'verb':<8} {'first -h (s)':>13} {'later -h (s)':>13}")
    for verb in VERBS:
        print(f"{verb:<8} {cold[verb]:>13.2f} {warm[verb]:>13.2f}")
    print(f"slowest: first {max(cold.values()):.2f} s ({max(cold, key=cold.get)}), "
          f"later {max(warm.values()):.2f} s ({max(warm, key=warm.get)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
