"""`suite sweep FILE`, `suite status FILE`, `suite cancel FILE` (registered in suite.cli);
HELP is what `suite sweep|status|cancel -h` shows."""

from __future__ import annotations

import argparse
import shlex
import sys

from suite.cli_common import GroupsHelp

STATUS_HELP = """The state of each cell of a sweep file's matrix: done, running, pending, failed, missing.
Reads only: changes nothing, submits nothing.

    suite status experiments/main_table.yaml                 # as it was launched
    suite status experiments/main_table.yaml launcher=slurm cluster=h100x8

Give the same overrides (and --only) as the launch, so the matrix is the one that ran; docs/sweeps.md.
"""

CANCEL_HELP = """Cancel what a sweep has queued or running (its SLURM array, or its local processes);
finished cells and their runs stay, and a later `suite sweep FILE` resumes the rest.

    suite cancel experiments/main_table.yaml
    suite cancel experiments/main_table.yaml launcher=slurm cluster=h100x8

Give the same overrides as the launch; docs/sweeps.md.
"""

HELP = """Run a sweep file's matrix of runs, show its state, or cancel it.

    suite sweep experiments/quickstart.yaml --dry-run        # the expanded matrix; submits nothing
    suite sweep experiments/quickstart.yaml                  # run it here (bounded concurrency), wait
    suite sweep experiments/main_table.yaml launcher=slurm cluster=h100x8   # a job array; returns
    suite status experiments/main_table.yaml                 # done / running / pending / failed
    suite cancel experiments/main_table.yaml                 # cancel what is queued or running

Arguments after FILE are Hydra overrides for every cell, except `launcher=local|slurm`,
`launcher.<field>=...`, `cluster=<profile>` and `resources.<field>=...`, which configure the
sweep (`--launcher`, `--profile`, `--max-parallel` are the same as flags). Re-running a sweep
skips finished cells and resumes interrupted ones; docs/sweeps.md has the file format.
"""


def _reparse(args: argparse.Namespace, kind: str) -> argparse.Namespace:
    """Options may follow FILE (`suite sweep FILE --dry-run steps=10`): argparse cannot split
    positionals around options, so everything after FILE is parsed again, intermixed."""
    p = argparse.ArgumentParser(prog=f"suite {kind} FILE")
    _options(p, kind)
    p.add_argument("overrides", nargs="*")
    # a fresh namespace: parse_intermixed_args warns about (and mishandles) a positional already set
    fresh = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "overrides"})
    return p.parse_intermixed_args(args.rest, namespace=fresh)


def _load(args: argparse.Namespace):
    from suite.sweep.spec import SweepError, load_sweep

    args = _reparse(args, args.kind)
    extra = list(args.overrides)
    if getattr(args, "launcher", None):
        extra.append(f"launcher={args.launcher}")
    if getattr(args, "profile", None):
        extra.append(f"cluster={args.profile}")
    if getattr(args, "max_parallel", None) is not None:  # 0 too: refused by the launcher's check, not ignored
        extra.append(f"launcher.max_parallel={args.max_parallel}")
    if getattr(args, "max_cells", None) is not None:
        extra.append(f"launcher.max_cells={args.max_cells}")
    try:
        # status: what the last launch submitted
        return load_sweep(args.file, extra, recorded=args.kind == "status", only=getattr(args, "only", None) or ())
    except SweepError as exc:
        print(f"suite: bad sweep: {exc}", file=sys.stderr)
        sys.exit(2)


def parallelism(sweep) -> int:
    """Cells running at once: local processes, or the SLURM array's %N."""
    return sweep.launcher.array_parallelism if sweep.launcher.name == "slurm" else sweep.launcher.max_parallel


def print_matrix(sweep, stream=None) -> None:
    """The dry-run table: one row per run with its axes and run id, then its command."""
    stream = stream or sys.stdout
    keys = sweep.axis_keys
    rows = [[str(c.index), *(c.axes.get(k, "-") for k in keys), c.run_id] for c in sweep.cells]
    header = ["cell", *keys, "run id"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    launcher = sweep.launcher.name + (f" (profile {sweep.launcher.profile})" if sweep.launcher.name == "slurm" else "")
    print(f"sweep {sweep.name}: {len(sweep.cells)} cells, launcher {launcher}, "
          f"at most {parallelism(sweep)} at once; state {sweep.state_dir}", file=stream)
    if sweep.resources_note:
        from dataclasses import asdict

        shown = ", ".join(f"{k}={v}" for k, v in asdict(sweep.resources).items() if v is not None)
        print(f"{sweep.resources_note}: {shown or 'the profile as is'}", file=stream)
    for line in eval_protocol_lines(sweep):
        print(line, file=stream)
    print(fmt.format(*header), file=stream)
    slurm = sweep.launcher.name == "slurm"
    for c, r in zip(sweep.cells, rows):
        print(fmt.format(*r), file=stream)
        # on SLURM each job runs `suite run` with the cell's overrides; the backend's own command
        # (verl's main_ppo line, hundreds of characters) is in the preview file
        print(f"    $ {shlex.join(['suite', 'run', *c.overrides]) if slurm else shlex.join(c.command())}", file=stream)
    from suite.sweep.estimate import estimate_lines

    for line in estimate_lines(sweep, parallelism(sweep)):
        print(line, file=stream)
    if slurm:
        preview = write_preview(sweep)
        print(f"preview: {preview}/sbatch.sh (the script sbatch gets) and {preview}/commands.sh (each cell's "
              f"command as its job runs it)", file=stream)
    print(f"dry run: nothing submitted ({len(sweep.cells)} cells validated)", file=stream, flush=True)


def eval_protocol_lines(sweep) -> list[str]:
    """How `suite eval` will score the sweep's cells (per recipe: the protocol, and each value's source)."""
    import importlib

    from suite.backend import BACKENDS
    from suite.recipes import RECIPES, eval_sources

    lines, seen = [], set()
    for c in sweep.cells:
        recipe = str(c.cfg.backend.recipe) if c.cfg.backend.name == "verl" else ""
        if recipe not in RECIPES or recipe in seen:
            continue
        seen.add(recipe)
        evaluate = importlib.import_module(f"{BACKENDS[c.cfg.backend.name]}.evaluate")  # by name: a backend
        lines.append(f"eval protocol of recipe {recipe} (suite eval, per benchmark): "
                     f"{evaluate.protocol(c.cfg).describe()}")
        lines += [f"    {key}={value}  <- {source}" for key, value, source in eval_sources(recipe)]
    return lines


def write_preview(sweep) -> str:
    """`<state dir>/dry-run/`: the sbatch script of the array and each cell's backend command.
    Only these files: no lock, no record of a launch, nothing a later `suite sweep` reads."""
    from pathlib import Path

    from suite.launch.executors import sbatch_preview
    from suite.sweep.states import SUBMITIT_DIR
    from suite.tracking.rundir import atomic_write_text

    folder = Path(sweep.state_dir) / "dry-run"
    folder.mkdir(parents=True, exist_ok=True)
    script = sbatch_preview(sweep.launcher, Path(sweep.state_dir) / SUBMITIT_DIR, len(sweep.cells), sweep.resources,
                            job_name=sweep.name, sweep_path=sweep.path)
    atomic_write_text(folder / "sbatch.sh", script)
    lines = ["#!/usr/bin/env bash", f"# {sweep.name}: what each array task of `{sweep.path}` runs (dry run; "
             "a job runs the cell's config as this driver composed it, as `suite run` with the "
             "cell's overrides would, which runs this)"]
    for c in sweep.cells:
        lines += [f"\n# cell {c.index}: {' '.join(f'{k}={v}' for k, v in c.axes.items())}  ({c.run_id})",
                  shlex.join(c.command())]
    atomic_write_text(folder / "commands.sh", "\n".join(lines) + "\n")
    return str(folder)


def cmd_sweep(args: argparse.Namespace) -> int:
    from suite.tracking.fscheck import writable_problem

    sweep = _load(args)
    args = _reparse(args, "sweep")
    # before anything prints: a dry run writes its preview under the state dir, a launch its records
    if (problem := writable_problem(sweep.state_dir, "out_dir: the sweep's state", is_dir=True)) is not None:
        print(f"suite: bad sweep: {problem}", file=sys.stderr)
        return 2
    if args.dry_run:
        print_matrix(sweep)
        return 0
    from suite.sweep.launch import launch
    from suite.sweep.spec import SweepError

    try:
        return launch(sweep, retry_failed=args.retry_failed, wait=args.wait or None)
    except SweepError as exc:
        print(f"suite: cannot launch: {exc}", file=sys.stderr)
        return 2


def cmd_status(args: argparse.Namespace) -> int:
    """Reads only: the cells' states, and a hint when the parent run has not recorded the end."""
    from suite.sweep.parent import parent_status
    from suite.sweep.spec import SweepError
    from suite.sweep.states import cell_states, print_states

    sweep = _load(args)
    try:
        states = cell_states(sweep)
        print(f"sweep {sweep.name} ({sweep.path}); state {sweep.state_dir}")
        if sweep.launch_note:
            print(f"note: {sweep.launch_note}")
        print_states(states, sweep=sweep)
        if all(s.state == "done" for s in states):
            try:
                running = parent_status(sweep) == "RUNNING"
            except SweepError:
                raise  # a damaged parent record: named below
            except Exception as exc:  # noqa: BLE001 - the cells' states come from their run dirs; MLflow only adds this
                print(f"note: the MLflow parent run's status is unknown ({type(exc).__name__}: the store does not "
                      "answer)")
                running = False
            if running:  # a `--no-wait` SLURM sweep: its driver returned before the end; the next one records it
                print(f"every cell is done; `suite sweep {args.file}` marks the MLflow parent run FINISHED")
    except SweepError as exc:  # a damaged state file, named
        print(f"suite status: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from suite.sweep.launch import cancel
    from suite.sweep.spec import SweepError

    sweep = _load(args)
    try:
        cancel(sweep)
    except SweepError as exc:  # a damaged state file, named
        print(f"suite cancel: {exc}", file=sys.stderr)
        return 2
    return 0


def register(subparsers) -> None:
    verbs = (("sweep", cmd_sweep, "expand a sweep file and run its matrix (local or SLURM)"),
             ("status", cmd_status, "state of each cell of a sweep"),
             ("cancel", cmd_cancel, "cancel a sweep's queued and running jobs"))
    descriptions = {"sweep": HELP, "status": STATUS_HELP, "cancel": CANCEL_HELP}
    for name, func, text in verbs:
        p = subparsers.add_parser(name, help=text, description=descriptions[name], add_help=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("-h", "--help", action=GroupsHelp, help="show this help and the config groups, and exit")
        _options(p, name)
        p.add_argument("file", help="sweep file, e.g. experiments/quickstart.yaml (status/cancel: with the "
                                    "same overrides it was launched with)")
        p.add_argument("rest", nargs=argparse.REMAINDER, metavar="OVERRIDES",
                       help="Hydra overrides for every cell (e.g. steps=10), launcher=..., cluster=...")
        p.set_defaults(func=func, kind=name)


def _options(p: argparse.ArgumentParser, kind: str) -> None:
    if kind == "sweep":
        p.add_argument("--dry-run", action="store_true", help="print the expanded matrix and commands; submit nothing")
        p.add_argument("--retry-failed", action="store_true", help="re-submit failed cells too")
        p.add_argument("--wait", action="store_true", help="slurm: wait for the array and print each result")
        p.add_argument("--only", action="append", metavar="KEY=V1,V2",
                       help="only the cells whose matrix axis KEY has one of these values (repeatable), e.g. "
                            "--only seed=0; a later launch without it adds the other cells")
    p.add_argument("--launcher", choices=("local", "slurm"), help="= launcher=NAME")
    p.add_argument("--profile", help="slurm cluster profile in slurm/profiles/ (= cluster=NAME)")
    p.add_argument("--max-parallel", type=int, help="runs at once: local processes, or the SLURM array's %%N "
                                                    "(default there: the cluster profile's array_parallelism)")
    p.add_argument("--max-cells", type=int, help="largest matrix accepted, in cells (= launcher.max_cells=N; "
                                                 "default 10000)")
