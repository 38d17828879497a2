"""What every benchmark shares: the machine header, interleaved timing, tables, MLflow logging.

Every comparison a benchmark reports is a ratio of variants measured side by side in one
process: each variant is warmed up, then the variants are timed in turn, round after round,
with the order rotated each round (so a slow period of a shared machine hits every variant
alike), and each variant's time is the median of its rounds.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

BENCH_EXPERIMENT = "suite-bench"  # default MLflow experiment of the benchmarks


class BenchError(ValueError):
    """A benchmark option that cannot run; the message names the option and the allowed values."""


# ----------------------------------------------------------------------------- options


def parse_list(option: str, text: str, allowed: Sequence[str] | None = None) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; with ``allowed``, an unknown item raises naming the option."""
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise BenchError(f"{option}: empty list")
    if allowed is not None:
        for item in items:
            if item not in allowed:
                raise BenchError(f"{option}={item!r} is not allowed; choose from: {', '.join(allowed)}")
    return items


def parse_ints(option: str, text: str, minimum: int = 1) -> list[int]:
    """``"8,64"`` -> ``[8, 64]``; every value must be an integer >= ``minimum``."""
    out = []
    for item in parse_list(option, text):
        try:
            value = int(item)
        except ValueError:
            raise BenchError(f"{option}={item!r} is not an integer") from None
        if value < minimum:
            raise BenchError(f"{option}={value} must be >= {minimum}")
        out.append(value)
    return out


def add_common_args(p) -> None:
    """Options every `suite bench` subcommand takes."""
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list on stdout (header on stderr)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds per variant; the median is reported (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds per variant before timing (default 1)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store for the benchmark run (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    p.add_argument("--experiment", default=BENCH_EXPERIMENT, help=f"MLflow experiment (default {BENCH_EXPERIMENT})")
    p.add_argument("--no-mlflow", action="store_true", help="do not log the benchmark to MLflow")
    p.add_argument("--out", default="bench_results",
                   help="directory for the table files (<name>.json, <name>.md) logged as artifacts "
                        "(default bench_results)")


def check_common(args) -> None:
    if args.repeats < 1:
        raise BenchError(f"--repeats={args.repeats} must be >= 1")
    if args.warmup < 0:
        raise BenchError(f"--warmup={args.warmup} must be >= 0")
    if args.threads < 0:
        raise BenchError(f"--threads={args.threads} must be >= 0 (0 = torch's default)")


# ----------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    """CPU features that decide which kernels are fast (detected at run time), torch, threads, CUDA."""
    import torch

    from suite.hardware import cpu_features

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "avx2": bool(torch.cpu._is_avx2_supported()),
        "avx512": bool(torch.cpu._is_avx512_supported()),
        "avx512_vnni": bool(torch.cpu._is_vnni_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
        "amx": bool(torch.cpu._is_amx_tile_supported()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "python": platform.python_version(),
        # what the kernel choices saw: the detected flags lowered by an ISA cap (suite.hardware)
        "cpu_flags": cpu_features().label(),
    }
    try:
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        info["loadavg_1m"] = float("nan")
    return info


def header(title: str, info: Mapping[str, Any]) -> str:
    """Two lines naming the benchmark and the machine it ran on."""
    flags = [f for f in ("avx2", "avx512", "avx512_vnni", "avx512_bf16", "amx") if info.get(f)]
    missing = [f for f in ("avx512", "avx512_vnni", "avx512_bf16", "amx") if not info.get(f)]
    cuda = info["cuda"] or "no CUDA device"
    return (f"# suite bench {title}\n"
            f"# {info['cpu']}, {info['cores']} cores, {info['threads']} torch threads, load {info['loadavg_1m']} | "
            f"has: {' '.join(flags) or '-'} | lacks: {' '.join(missing) or '-'} | torch {info['torch']} | {cuda}")


def set_threads(n: int) -> None:
    if n > 0:
        import torch

        torch.set_num_threads(n)


def note(msg: str) -> None:
    """Progress and notes go to stderr, so that --json output stays clean."""
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- timing


def interleaved(fns: Mapping[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                timer: Callable[[], float] = time.perf_counter,
                on_round: Callable[[int], None] | None = None) -> dict[str, list[float]]:
    """Seconds of each call of each variant: ``warmup`` untimed calls per variant, then
    ``repeats`` rounds in which every variant runs once, the order rotated by one each round."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = timer()
            fns[name]()
            times[name].append(timer() - t0)
        if on_round is not None:
            on_round(r)
    return times


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: Sequence[float]) -> float:
    """(max - min) / median of the repeats: how noisy a timing was (0 = perfectly steady)."""
    m = median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else float("nan")


# ----------------------------------------------------------------------------- tables


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "-"
        a = abs(v)
        if a >= 1000:
            return f"{v:.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1 or a == 0:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows`` restricted to ``columns`` (missing values shown as -)."""
    cells = [[_fmt(r.get(c, float("nan"))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(columns)]
    line = lambda vals: "| " + " | ".join(v.rjust(w) for v, w in zip(vals, widths)) + " |"  # noqa: E731
    out = [line(columns), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in cells]
    return "\n".join(out)


def emit(args, name: str, title: str, info: Mapping[str, Any], rows: list[dict], columns: Sequence[str],
         notes: Sequence[str] = (), params: Mapping[str, Any] | None = None,
         metrics: Mapping[str, float] | None = None) -> None:
    """Print the table (or the JSON rows), write ``<out>/<name>.{json,md}`` and log the
    benchmark as one MLflow run with both files as artifacts."""
    head = header(title, info)
    md = "\n".join([head, "", table(rows, columns), *([""] + [f"- {n}" for n in notes] if notes else [])]) + "\n"
    if args.json:
        note(head)
        for n in notes:
            note(f"# {n}")
        print(json.dumps(rows, indent=1, default=_json_default))
    else:
        print(md, end="", flush=True)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{name}.json")
    md_path = os.path.join(args.out, f"{name}.md")
    with open(json_path, "w") as fh:
        json.dump({"bench": name, "machine": dict(info), "notes": list(notes), "rows": rows}, fh, indent=1,
                  default=_json_default)
    with open(md_path, "w") as fh:
        fh.write(md)
    if not args.no_mlflow:
        run_id = log_mlflow(args.tracking_uri, args.experiment, name, info, params or {}, metrics or {},
                            [json_path, md_path])
        note(f"# logged to MLflow run {run_id} (experiment {args.experiment!r}, {log_uri(args.tracking_uri)})")


def _json_default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def log_uri(uri: str | None) -> str:
    from suite.tracking.loggers import resolve_tracking_uri

    return resolve_tracking_uri(uri)


def log_mlflow(tracking_uri: str | None, experiment: str, name: str, info: Mapping[str, Any],
               params: Mapping[str, Any], metrics: Mapping[str, float], artifacts: Sequence[str]) -> str:
    """One MLflow run per benchmark: machine tags, options as params, headline numbers as
    metrics (step 0), the table files as artifacts. Returns the MLflow run id."""
    from suite.tracking.loggers import MlflowLogger

    tags = {"suite.kind": "bench", "bench": name, **{f"machine.{k}": v for k, v in info.items()}}
    logger = MlflowLogger(tracking_uri, experiment, f"bench-{name}", tags=tags)
    logger.log_params(dict(params))
    if metrics:
        logger.log_metrics({k: float(v) for k, v in metrics.items() if v == v}, step=0)
    for path in artifacts:
        logger.log_artifact(path)
    logger.close("FINISHED")
    if logger.run_id is None:
        raise RuntimeError(f"MLflow at {logger.tracking_uri} did not accept the benchmark run")
    return logger.run_id
