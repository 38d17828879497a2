"""`suite eval RUN_DIR|SWEEP_FILE`: score trained policies per benchmark (suite.evaluation)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from suite.cli_common import GroupsHelp
from suite.evaluation import CHECKPOINTS, ENGINES, EvalError, log_to_mlflow, read_results, write_results

EVAL_HELP = """Score a trained policy per benchmark, the papers' way: in bf16 (and the run's rollout engine).

    suite eval runs/RUN_ID                                  # last checkpoint, bf16, every benchmark
    suite eval runs/RUN_ID --precision bf16,rollout         # and the quantized rollout engine beside it
    suite eval runs/RUN_ID --benchmarks aime2024 --checkpoint best --select-on math500
    suite eval experiments/paper_tables.yaml backend=verl recipe=qurl-dapo ...   # every finished cell
    suite eval --model PATH recipe=qurl-deepscaler backend.val_files=...       # a base model (no run), step 0

Benchmarks: a verl run's held-out data sources (its backend.val_files: e.g. openai/gsm8k, aime2024,
olympiadbench); an embedded run's task at each difficulty that fits its model (arith-d1 .. arith-d4).
Each is scored with the run's validation protocol (samples per prompt, temperature, top_p: greedy
pass@1, or Avg@32 where the recipe says so) and its own scorer. Results: RUN_DIR/eval/step_N.json and
the run's MLflow metrics eval/<benchmark>/<engine>/acc/mean@k; a scored job is not scored again
(--force does). A sweep's finished cells are scored by its launcher: here, or as SLURM jobs.
"""


def _backend(cfg, path: Path):
    from suite.backend import BACKENDS

    name = OmegaConf.select(cfg, "backend.name", default=None) if isinstance(cfg, DictConfig) else None
    if name not in BACKENDS:
        raise EvalError(f"{path}: backend.name is {name!r}, not one of {', '.join(BACKENDS)} (not a suite run config, "
                        f"or a damaged one)")
    return importlib.import_module(f"{BACKENDS[name]}.evaluate")


def _run_config(run_dir: Path):
    from suite.tracking.rundir import CONFIG_FILE

    path = run_dir / CONFIG_FILE
    if not path.is_file():
        raise EvalError(f"{run_dir}: not a run directory (no {CONFIG_FILE}); give a run's directory, e.g. "
                        f"runs/<run_id>, or a sweep file")
    from suite.config import ConfigError, load_run_config

    try:
        return load_run_config(path)
    except ConfigError as exc:
        raise EvalError(str(exc)) from None


def _choose(flag: str, given: str | None, allowed: list[str], default: list[str]) -> list[str]:
    if given is None:
        return default
    chosen = [g.strip() for g in given.split(",") if g.strip()]
    bad = [g for g in chosen if g not in allowed]
    if not chosen or bad:
        raise EvalError(f"{flag} {bad[0] if bad else given!r}: not one of {', '.join(allowed)}")
    return list(dict.fromkeys(chosen))


def _selection(backend, cfg, checkpoint: str, select_on: str | None, reported: list[str]) -> list[str]:
    """The benchmarks `--checkpoint best` chooses on: never one it then reports (choosing a checkpoint on the
    set it is scored on inflates the score; the papers report the last step or a fixed one)."""
    allowed = backend.selection_benchmarks(cfg)
    if select_on is not None and checkpoint != "best":
        raise EvalError(f"--select-on {select_on!r}: chooses the checkpoint for --checkpoint best only")
    chosen = _choose("--select-on", select_on, allowed, allowed)
    if checkpoint == "best" and (both := [b for b in chosen if b in reported]):
        raise EvalError(f"--checkpoint best: chosen on the validation of {', '.join(both)}, which it would then "
                        f"report; report other benchmarks (--benchmarks), choose on others (--select-on, one of "
                        f"{', '.join(allowed)}), or give 'last' or a step")
    return chosen


def _step(backend, cfg, run_dir: Path, checkpoint: str, select_on: list[str]) -> int:
    steps = backend.checkpoint_steps(run_dir)
    if not steps:
        raise EvalError(f"{run_dir}: holds no checkpoint to score (a run writes one every ckpt_every="
                        f"{cfg.ckpt_every} steps and at its end)")
    if checkpoint == "last":
        return steps[-1]
    if checkpoint == "best":
        return backend.best_step(cfg, run_dir, steps, select_on)
    if checkpoint.isdigit() and int(checkpoint) in steps:
        return int(checkpoint)
    raise EvalError(f"--checkpoint {checkpoint!r}: not one of {', '.join([*CHECKPOINTS, *map(str, steps)])}")


def prepare(run_dir: str | os.PathLike, precision: str | None, benchmarks: str | None, checkpoint: str,
            select_on: str | None = None):
    """Everything `suite eval` checks before it writes: the run, its checkpoint (readable, of the run's
    model), the engines and benchmarks asked for and their data. (cfg, backend, step, engines, names)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EvalError(f"{run_dir}: no such run directory (or sweep file)")
    cfg = _run_config(run_dir)
    from suite.tracking.rundir import CONFIG_FILE

    backend = _backend(cfg, run_dir / CONFIG_FILE)
    engines = _choose("--precision", precision, list(backend.ENGINES), ["bf16"])
    names = backend.benchmark_names(cfg)  # verl: reads the val files, naming one that is missing
    chosen = _choose("--benchmarks", benchmarks, names, names)
    step = _step(backend, cfg, run_dir, checkpoint, _selection(backend, cfg, checkpoint, select_on, chosen))
    backend.check_checkpoint(cfg, run_dir, step)
    from suite.tracking.fscheck import writable_problem

    if (problem := writable_problem(run_dir / "eval", "the scores' directory", is_dir=True)) is not None:
        raise EvalError(problem)
    return cfg, backend, step, engines, chosen


def eval_run(run_dir: str | os.PathLike, precision: str | None = None, benchmarks: str | None = None,
             checkpoint: str = "last", force: bool = False, log=print, prepared: tuple | None = None,
             select_on: str | None = None) -> list:
    """Score one run (suite.evaluation); the scores of this checkpoint, old and new. ``prepared``:
    what `prepare` already returned for it (a sweep checks every cell before scoring any)."""
    cfg, backend, step, engines, names = prepared or prepare(run_dir, precision, benchmarks, checkpoint, select_on)
    done = [] if force else read_results(run_dir, step)
    t0 = time.perf_counter()
    new = backend.evaluate(cfg, str(run_dir), step=step, engines=engines, names=names, done=done, log=log)
    if new:
        path = write_results(run_dir, step, new)
        log(f"suite eval: {len(new)} new score(s) in {path} ({time.perf_counter() - t0:.1f} s)")
    scores = [s for s in read_results(run_dir, step) if s.engine in engines and s.benchmark in names]
    _to_mlflow(Path(run_dir), scores, log)
    return scores


def _to_mlflow(run_dir: Path, scores: list, log) -> None:
    import json

    from suite.tracking.rundir import RUN_FILE

    try:
        record = json.loads((run_dir / RUN_FILE).read_text())
        uri, rid = record["tracking_uri"], record["run_id"]
    except (OSError, ValueError, KeyError):
        log(f"suite eval: {run_dir} has no MLflow run ({RUN_FILE}); the scores are in {run_dir}/eval only")
        return
    if not rid:
        log(f"suite eval: MLflow never accepted {run_dir}'s run; the scores are in {run_dir}/eval only")
        return
    sent, problem = log_to_mlflow(uri, rid, scores)
    if problem:
        log(f"suite eval: MLflow at {uri} unreachable ({problem}); the scores are kept in {run_dir}/eval and "
            f"sent by the next `suite eval` of this run")
    else:
        log(f"suite eval: MLflow run {rid}: {sent} metric(s) sent, {len(scores) - sent} already there")


def _table(scores: list) -> str:
    rows = sorted(scores, key=lambda s: (s.benchmark, s.protocol.samples, s.metric_name, s.engine))
    lines = [f"{'benchmark':<24} {'metric':<9} {'engine':<8} {'acc %':>7}  n   protocol / engine"]
    for s in rows:
        lines.append(f"{s.benchmark:<24} {s.metric_name:<9} {s.engine:<8} {100 * s.acc:7.2f}  "
                     f"{s.n_prompts:<3} {s.protocol.describe()}; {s.engine_detail}")
    by = {}
    for s in rows:
        by.setdefault((s.benchmark, s.protocol, s.metric_name), {})[s.engine] = s.acc
    for (bench, _, metric), accs in by.items():
        if "rollout" in accs and len(accs) > 1:
            ref = "bf16" if "bf16" in accs else "fp32"
            lines.append(f"{bench} {metric}: rollout - {ref} = {100 * (accs['rollout'] - accs[ref]):+.2f} "
                         f"points (the rollout engine's own error)")
    return "\n".join(lines)


def _sweep_runs(path: str, overrides: list[str]):
    from suite.sweep.spec import load_sweep
    from suite.tracking.rundir import is_finished

    sweep = load_sweep(path, overrides)
    finished = [c for c in sweep.cells if is_finished(c.run_dir)]
    return sweep, finished


BASE_CORRECTION = "base"  # what a base model's row is, as the papers' published tables call it (suite.report.paper)


def eval_model(model: str, overrides: list[str], benchmarks: str | None, force: bool, log=print) -> list:
    """`suite eval --model PATH OVERRIDES`: a Hugging Face model that is not a run (a paper's base model) scored
    per benchmark in bf16 with the protocol the overrides compose (a recipe's), as step 0 of a run directory of
    its own (`<out_dir>/base-<run id>`) and an MLflow run tagged correction=base, which the report pairs with the
    papers' base rows."""
    from suite.cli_common import compose_or_exit
    from suite.identity import axes, identity_tags, run_id
    from suite.tracking.mlflow_logger import MlflowLogger
    from suite.tracking.rundir import CONFIG_FILE, atomic_write_text

    path = Path(model)
    if not (path / "config.json").is_file():
        raise EvalError(f"--model {model}: not a Hugging Face model directory (no config.json)")
    given = {o.split("=", 1)[0].lstrip("+") for o in overrides if "=" in o}
    if "backend.val_files" not in given:
        raise EvalError("--model: give the held-out files to score, backend.val_files=FILE[,FILE] (`suite data "
                        "prepare NAME --src FILE --out DIR` writes them), and the protocol, e.g. recipe=NAME")
    val = next(o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "backend.val_files")
    extra = [] if "backend.train_files" in given else [f"backend.train_files={val}"]  # nothing is trained
    cfg = compose_or_exit(["backend=verl", f"backend.model_path={path.resolve()}", *extra, *overrides,
                           "quant=bf16", "correction=naive", "uaq.s=1.0"])
    backend = _backend(cfg, Path("--model"))
    names = backend.benchmark_names(cfg)
    chosen = _choose("--benchmarks", benchmarks, names, names)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # before a run directory or an MLflow run exists
        raise EvalError("--model: serving a model needs vLLM in this environment (pip install -e '.[gpu]' on a GPU "
                        "node; on a CPU, the environment .ci/vllm-cpu builds)")
    run_dir = Path(cfg.out_dir) / f"base-{run_id(cfg)}"
    from suite.tracking.fscheck import writable_problem

    if (problem := writable_problem(run_dir, "the base model's scores' directory", is_dir=True)) is not None:
        raise EvalError(problem)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / CONFIG_FILE, OmegaConf.to_yaml(cfg, resolve=True))
    tags = {**axes(cfg), **identity_tags(cfg), "correction": BASE_CORRECTION, "run_id": f"base-{run_id(cfg)}",
            "suite.kind": "base-eval"}
    logger = MlflowLogger.for_run_dir(run_dir, cfg.tracking.tracking_uri, cfg.tracking.experiment,
                                      run_name=f"base {path.name} ({cfg.backend.recipe or 'no recipe'})", tags=tags)
    logger.close("FINISHED")
    done = [] if force else read_results(run_dir, 0)
    new = backend.evaluate(cfg, str(run_dir), step=0, engines=["bf16"], names=chosen, done=done, log=log,
                           model_dir=path.resolve())
    if new:
        log(f"suite eval: {len(new)} new score(s) in {write_results(run_dir, 0, new)}")
    scores = [s for s in read_results(run_dir, 0) if s.benchmark in chosen]
    _to_mlflow(run_dir, scores, log)
    return scores


def cmd_eval(args: argparse.Namespace) -> int:
    target = args.target
    try:
        if args.model is not None:
            overrides = ([target] if target else []) + list(args.overrides)
            print(_table(eval_model(args.model, overrides, args.benchmarks, args.force)))
            return 0
        if target is None:
            raise EvalError("give a run directory, a sweep file, or --model PATH")
        if os.path.isfile(target) and target.endswith((".yaml", ".yml")):
            return _eval_sweep(args)
        if args.overrides:
            raise EvalError(f"overrides {' '.join(args.overrides)!r}: a run directory takes none (its config is "
                            f"its own); they belong to a sweep file")
        scores = eval_run(target, args.precision, args.benchmarks, args.checkpoint, args.force,
                          select_on=args.select_on)
    except EvalError as exc:
        print(f"suite eval: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a run that cannot be rebuilt on this machine (e.g. its kernels): one line
        from suite.hardware import HardwareError

        if isinstance(exc, HardwareError):
            print(f"suite eval: cannot score here: {exc}", file=sys.stderr)
            return 2
        raise
    print(_table(scores))
    return 0


def _eval_sweep(args: argparse.Namespace) -> int:
    from suite.launch.fileio import SweepError

    try:
        sweep, finished = _sweep_runs(args.target, list(args.overrides))
    except SweepError as exc:
        raise EvalError(str(exc)) from None
    if not finished:
        raise EvalError(f"{args.target}: none of its {len(sweep.cells)} cells has finished; `suite status "
                        f"{args.target}` says where they are")
    # every cell checked before any is scored
    prepared = {c.index: prepare(c.run_dir, args.precision, args.benchmarks, args.checkpoint, args.select_on)
                for c in finished}
    print(f"suite eval: {len(finished)} finished cell(s) of {len(sweep.cells)} in {args.target}", flush=True)
    if sweep.launcher.name == "slurm":
        from suite.launch.slurm import slurm_problem

        if (problem := slurm_problem()) is not None:
            raise EvalError(problem)
        return _eval_on_slurm(sweep, finished, args)
    failed = 0
    for c in finished:
        print(f"suite eval: cell {c.index} {c.run_id}", flush=True)
        try:
            print(_table(eval_run(c.run_dir, force=args.force, prepared=prepared[c.index])))
        except Exception as exc:  # noqa: BLE001 - one cell's failure is reported; the others are still scored
            failed += 1
            first = str(exc).splitlines()[0][:300] if str(exc) else ""
            print(f"suite eval: cell {c.index} {c.run_id} failed: {type(exc).__name__}: {first}", file=sys.stderr)
    return 1 if failed else 0


def eval_job(run_dir: str, precision, benchmarks, checkpoint: str, force: bool, select_on=None) -> int:
    """One cell scored inside a SLURM job (the pickled function submitit runs)."""
    return len(eval_run(run_dir, precision, benchmarks, checkpoint, force, select_on=select_on))


def _eval_on_slurm(sweep, finished, args) -> int:
    from suite.launch.executors import make_executor

    folder = Path(sweep.state_dir) / "eval"
    ex = make_executor(sweep.launcher, folder, sweep.resources, job_name=f"eval-{sweep.name}",
                       sweep_path=args.target)
    jobs = ex.map_array(eval_job, [c.run_dir for c in finished], [args.precision] * len(finished),
                        [args.benchmarks] * len(finished), [args.checkpoint] * len(finished),
                        [args.force] * len(finished), [args.select_on] * len(finished))
    print(f"suite eval: submitted {len(jobs)} SLURM job(s) ({jobs[0].job_id.split('_')[0]}); logs in {folder}",
          flush=True)
    failed = 0
    for c, job in zip(finished, jobs):
        try:
            n = job.result()
            print(f"suite eval: cell {c.index} {c.run_id}: {n} score(s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - a failed cell is reported, the others still count
            failed += 1
            print(f"suite eval: cell {c.index} {c.run_id} failed: {str(exc).splitlines()[-1][:300]}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="score trained policies per benchmark (bf16 and the rollout engine)",
                              description=EVAL_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                              add_help=False)
    p.add_argument("-h", "--help", action=GroupsHelp, help="show this help and the config groups, and exit")
    p.add_argument("target", metavar="RUN_DIR|SWEEP_FILE", nargs="?", help="a run's directory, or a sweep file (its "
                   "finished cells); none with --model")
    p.add_argument("overrides", nargs="*", help="a sweep file's overrides, as given to `suite sweep`")
    p.add_argument("--precision", default=None,
                   help=f"engines, comma separated: {', '.join(ENGINES)} (fp32: embedded runs; default bf16)")
    p.add_argument("--benchmarks", default=None, help="comma separated; default: every benchmark of the run")
    p.add_argument("--checkpoint", default="last", help="last (default), best (the best validated step on "
                   "--select-on, never a benchmark it reports), or a step")
    p.add_argument("--select-on", default=None, help="benchmarks whose in-training validation --checkpoint best "
                   "chooses on (comma separated; default: every validated one); none may be among --benchmarks")
    p.add_argument("--force", action="store_true", help="score again what was scored")
    p.add_argument("--model", default=None, metavar="PATH", help="score a Hugging Face model that is not a run (a "
                   "paper's base model) with the protocol its overrides compose, e.g. recipe=NAME backend.val_files=F")
    p.set_defaults(func=cmd_eval)
