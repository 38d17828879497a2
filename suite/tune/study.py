"""The study driver: Optuna ask/tell over trials that run as launcher jobs.

    summary = run_study(load_tune_file("experiments/tune_uaq.yaml"))

- The study lives in the tune file's storage (sqlite file or any RDB URL) under its name;
  running the same file again loads it and runs only the trials still missing.
- Each trial is asked here (`study.ask` with the file's distributions), runs as one job of
  the local or SLURM launcher (`suite.tune.worker.run_trial`), reports held-out accuracy to
  the storage at each evaluation and stops when the pruner says so, and is told here.
- MLflow: one parent run per study (its id is a study user attribute, and the run carries
  tags `tune_study=<name>`, `tune_role=study`), one child run per trial number (tags
  `tune_study`, `trial=<n>`, and `trial_state` once told).
- Trials left RUNNING by a killed `suite tune` are resumed, not failed and not re-asked: the
  same trial number is submitted again into its run directory, which resumes from its last
  checkpoint (or returns at once when the orphaned job finished it), and logs to the same
  MLflow child run. So a crash costs at most the steps after the last checkpoint, and never
  creates a second trial or a second MLflow run for one configuration.
"""

from __future__ import annotations

import gc
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

from suite.tracking.experiments import SOURCE_NAME_TAG, suite_command, ui_hint
from suite.tracking.rundir import recorded_mlflow_run_id
from suite.tune.spec import LauncherSpec, ParamSpec, SamplerSpec, TuneSpec, TuneSpecError
from suite.tune.worker import build_pruner, driver_lock, trial_job

ROLE_TAG, STUDY_TAG, TRIAL_TAG, STATE_TAG = "tune_role", "tune_study", "trial", "trial_state"
PARENT_ATTR, URI_ATTR, SPACE_ATTR = "mlflow_parent_run_id", "mlflow_tracking_uri", "search_space"
PROGRESS_EVERY_S = 60.0  # the aggregate line (suite.launch.progress) at least this often while trials run (seconds)


def _optuna():
    try:
        import optuna
    except ImportError as exc:  # pragma: no cover - a core dependency in pyproject.toml
        raise ImportError("suite tune needs Optuna: pip install -e . (optuna>=4)") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


# --------------------------------------------------------------------------- builders


def distribution(p: ParamSpec):
    """The Optuna distribution of one parameter."""
    optuna = _optuna()
    if p.type == "categorical":
        return optuna.distributions.CategoricalDistribution(list(p.choices))
    if p.type == "int":
        return optuna.distributions.IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
    return optuna.distributions.FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)


def distributions(spec: TuneSpec) -> dict:
    return {name: distribution(p) for name, p in spec.space.items()}


def grid_space(spec: TuneSpec) -> dict[str, list]:
    """Every value of each parameter for sampler=grid: choices, or low..high by step."""
    out = {}
    for name, p in spec.space.items():
        if p.type == "categorical":
            out[name] = list(p.choices)
        elif p.type == "int":
            out[name] = list(range(int(p.low), int(p.high) + 1, int(p.step or 1)))
        else:
            k = int(math.floor((p.high - p.low) / p.step + 1e-9))
            out[name] = [round(p.low + i * p.step, 12) for i in range(k + 1)]
    return out


def build_sampler(s: SamplerSpec, spec: TuneSpec):
    optuna = _optuna()
    if s.name == "tpe":
        return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    return optuna.samplers.GridSampler(grid_space(spec), seed=s.seed)


def resolve_storage(url: str) -> str:
    """Relative sqlite paths made absolute, so trial jobs (other directories, other nodes
    sharing the file system) open the same file."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        rel = url[len("sqlite:///"):]
        if rel and rel != ":memory:":
            return "sqlite:///" + str(Path(rel).expanduser().resolve())
    return url


def _check_writable(storage_url: str, tracking_uri: str, sdir: Path) -> None:
    from suite.tracking.fscheck import writable_problem
    from suite.tracking.outage import StoreUnreachable, check_store

    checks = [(sdir, "out_dir: the study's directory", True)]
    if storage_url.startswith("sqlite:///"):
        checks.append((storage_url[len("sqlite:///"):], f"storage {storage_url}", False))
    if tracking_uri.startswith("sqlite:///"):
        checks.append((tracking_uri[len("sqlite:///"):], f"tracking.tracking_uri={tracking_uri}", False))
    for path, what, is_dir in checks:
        if (problem := writable_problem(path, what, is_dir=is_dir)) is not None:
            raise TuneSpecError(problem)
    try:
        check_store(tracking_uri, verb="suite tune")
    except StoreUnreachable as exc:
        raise TuneSpecError(str(exc)) from None


def study_dir(spec: TuneSpec) -> Path:
    return Path(spec.out_dir).expanduser().resolve() / spec.study


def trial_dir(spec: TuneSpec, number: int) -> str:
    return str(study_dir(spec) / f"trial-{number:04d}")


def open_study(spec: TuneSpec, storage_url: str, *, create: bool = True):
    """Create or load the study, checking that direction and search space are those it began with."""
    from suite.tune.worker import open_storage

    optuna = _optuna()
    storage = open_storage(storage_url)
    kwargs = dict(study_name=spec.study, storage=storage, sampler=build_sampler(spec.sampler, spec),
                  pruner=build_pruner(spec.pruner))
    if create:
        study = optuna.create_study(direction=spec.objective.direction, load_if_exists=True, **kwargs)
    else:
        try:
            study = optuna.load_study(**kwargs)
        except KeyError as exc:
            raise TuneSpecError(f"study: no study {spec.study!r} in {storage_url}; "
                                "run `suite tune FILE` first") from exc
    if study.direction.name.lower() != spec.objective.direction:
        raise TuneSpecError(
            f"objective.direction: study {spec.study!r} was created to {study.direction.name.lower()}; "
            f"the file says {spec.objective.direction}. Use a new study name for a new objective"
        )
    space = json.dumps({k: asdict(p) for k, p in sorted(spec.space.items())}, sort_keys=True)
    old = study.user_attrs.get(SPACE_ATTR)
    if old is None:
        study.set_user_attr(SPACE_ATTR, space)
    elif old != space:
        raise TuneSpecError(
            f"space: the search space of study {spec.study!r} changed since it began (stored: {old}); "
            f"continuing would mix two searches. Use a new study name"
        )
    return study


# --------------------------------------------------------------------------- MLflow


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def ensure_parent_run(study, spec: TuneSpec, tracking_uri: str, experiment: str, spec_text: str) -> str:
    """The study's MLflow parent run: the one recorded in the study, or one found by its tags
    (a crash between creating and recording it), or a new one."""
    client = _client(tracking_uri)
    run_id = study.user_attrs.get(PARENT_ATTR) if study.user_attrs.get(URI_ATTR) == tracking_uri else None
    if run_id is None:
        from suite.tracking.experiments import create_run, experiment_id

        exp_id = experiment_id(client, experiment)
        found = client.search_runs(
            [exp_id], filter_string=f"tags.{STUDY_TAG} = '{spec.study}' and tags.{ROLE_TAG} = 'study'",
            max_results=1,
        )
        if found:
            run_id = found[0].info.run_id
        else:
            run = create_run(client, experiment, run_name=spec.study, tags={STUDY_TAG: spec.study, ROLE_TAG: "study"})
            run_id = run.info.run_id
            from mlflow.entities import Param

            flat = {"storage": spec.storage, "n_trials": spec.n_trials, "parallelism": spec.parallelism,
                    "objective.metric": spec.objective.metric, "objective.direction": spec.objective.direction,
                    "sampler": spec.sampler.name, "pruner": spec.pruner.name, "launcher": spec.launcher.name,
                    "base": " ".join(spec.base)}
            for k, p in spec.space.items():
                flat[f"space.{k}"] = json.dumps({f: v for f, v in asdict(p).items() if v is not None})
            client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in flat.items()])
            client.log_text(run_id, spec_text, "tune_file.yaml")
        study.set_user_attr(PARENT_ATTR, run_id)
        study.set_user_attr(URI_ATTR, tracking_uri)
    else:
        client.update_run(run_id, status="RUNNING")
    return run_id


def child_runs(tracking_uri: str, parent_run_id: str, study_name: str) -> list:
    """The MLflow child runs of a study (every trial's run), oldest first."""
    client = _client(tracking_uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id], filter_string=f"tags.{STUDY_TAG} = '{study_name}'",
                              max_results=10_000, order_by=["attributes.start_time ASC"])
    return [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_run_id
            and r.data.tags.get(ROLE_TAG) != "study"]


def _mark_child(tracking_uri: str, run_id: str | None, state: str, value: float | None) -> None:
    if not run_id:
        return
    client = _client(tracking_uri)
    client.set_tag(run_id, STATE_TAG, state)
    if state == "FAIL" and client.get_run(run_id).info.status == "RUNNING":
        client.set_terminated(run_id, status="FAILED")
    if value is not None:
        client.set_tag(run_id, "trial_value", f"{value:.6g}")


# --------------------------------------------------------------------------- launcher


def make_executor(launcher: LauncherSpec, folder: str, job_name: str = "tune"):
    """A submitit executor for the trial jobs: the sweep launcher's (`suite.sweep.launch`:
    submitit's LocalExecutor, or SLURM with a profile from slurm/profiles/). The one place
    that chooses how a trial is launched."""
    from suite.launch.executors import make_executor as sweep_executor
    from suite.launch.config import LauncherConfig, Resources
    from suite.launch.fileio import SweepError

    try:
        return sweep_executor(
            LauncherConfig(name=launcher.name, profile=launcher.profile or "dev"), folder,
            Resources(timeout_min=launcher.timeout_min, cpus_per_task=launcher.cpus_per_task), job_name=job_name,
        )
    except SweepError as exc:
        raise TuneSpecError(f"launcher: {exc}") from exc


# --------------------------------------------------------------------------- driver


def _fmt_params(params: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def run_study(spec: TuneSpec, spec_text: str = "", *, out=None) -> dict:
    """Run (or continue) the study until it holds ``spec.n_trials`` finished trials.

    Returns {study, storage, n_complete, n_pruned, n_failed, best_number, best_value, best_params,
    parent_run_id}. The search space was checked against the run config before any trial.
    """
    from suite.config import compose_config
    from suite.tracking.loggers import resolve_tracking_uri
    from suite.tune.spec import check_against_config, param_override

    out = out or (lambda msg: print(msg, flush=True))
    base = check_against_config(spec, compose_config)
    if base.backend.name != "embedded":
        raise TuneSpecError(f"base: backend.name={base.backend.name}: suite tune runs embedded trials "
                            f"(pruning needs the trainer's on_eval hook); allowed: embedded")
    _optuna()
    from optuna.trial import TrialState

    storage_url = resolve_storage(spec.storage)
    tracking_uri = resolve_tracking_uri(base.tracking.tracking_uri)
    sdir = study_dir(spec)
    _check_writable(storage_url, tracking_uri, sdir)  # before the study, its directory or a parent run exist
    if spec.launcher.name == "slurm":
        from suite.launch.slurm import slurm_problem

        if (problem := slurm_problem()) is not None:
            raise TuneSpecError(problem)
    sdir.mkdir(parents=True, exist_ok=True)
    n_target = spec.n_trials
    if spec.sampler.name == "grid":
        size = math.prod(len(v) for v in grid_space(spec).values())
        if size < n_target:
            out(f"sampler=grid: the grid has {size} points; running {size} trials, not n_trials={n_target}")
            n_target = size

    with driver_lock(storage_url):
        study = open_study(spec, storage_url)
        parent = ensure_parent_run(study, spec, tracking_uri, base.tracking.experiment, spec_text)
        out(f"suite tune {spec.study}: storage {storage_url}\n  trials: {sdir}/trial-NNNN\n  "
            f"mlflow: {tracking_uri} (experiment {base.tracking.experiment!r}, parent run {parent})\n"
            f"  MLflow UI: {ui_hint(tracking_uri, parent)}")
        _reconcile(study, tracking_uri, out)
        dists = distributions(spec)
        executor = make_executor(spec.launcher, str(sdir / "jobs"), job_name=f"tune-{spec.study}")

        def submit(trial_number: int, trial_id: int, params: dict):
            param_ov = [param_override(k, v) for k, v in params.items()]
            overrides = [*spec.base, *param_ov, f"tracking.tracking_uri={tracking_uri}",
                         f"threads={spec.launcher.cpus_per_task}"]
            payload = {
                "study": spec.study, "storage": storage_url, "pruner": asdict(spec.pruner),
                "number": trial_number, "trial_id": trial_id, "overrides": overrides, "param_overrides": param_ov,
                "run_dir": trial_dir(spec, trial_number), "parent_run_id": parent,
                "tags": {STUDY_TAG: spec.study, TRIAL_TAG: str(trial_number), SOURCE_NAME_TAG: suite_command()},
                "metric": spec.objective.metric,
                # the runs table tells trials apart by what was searched
                "run_name": f"{spec.study} trial {trial_number}: {_fmt_params(params)}",
            }
            from suite.launch.executors import controller_stderr

            with controller_stderr(executor):
                return executor.submit(trial_job, payload)

        pending: dict[int, object] = {}
        resumed = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        for t in resumed:
            out(f"trial {t.number}: left running by an interrupted `suite tune`; resuming it "
                f"in {trial_dir(spec, t.number)}")
        queue = list(resumed)
        t0 = time.perf_counter()
        from suite.launch.guard import Driver, job_target

        # a stop signal or an error: the trials' jobs are cancelled and their MLflow runs end KILLED;
        # the Optuna trials stay RUNNING, so the next `suite tune` resumes them from their checkpoints
        drv = Driver(tracking_uri, parent, lambda: [job_target(f"trial {n}", j, trial_dir(spec, n))
                                                    for n, j in sorted(pending.items())], out=out)
        try:
            with drv:
                _drive(study, spec, dists, pending, queue, n_target, submit, drv, tracking_uri, out, t0)
        except KeyboardInterrupt:
            out("interrupted: the running trials were stopped and stay RUNNING in the study; "
                "`suite tune FILE` again resumes them from their checkpoints")
            raise
        # submitit's LocalJob.__del__ polls its folder: let finished jobs go before interpreter shutdown.
        executor = drv = None
        gc.collect()
        summary = _summary(study, spec, storage_url, parent)
        _client(tracking_uri).set_terminated(parent, status="FINISHED")
        out(f"study {spec.study}: {summary['n_complete']} complete, {summary['n_pruned']} pruned, "
            f"{summary['n_failed']} failed in {(time.perf_counter() - t0) / 60:.1f} min; best "
            + (f"trial {summary['best_number']}: {spec.objective.metric} = {summary['best_value']:.4f} "
               f"({_fmt_params(summary['best_params'])})" if summary["best_number"] is not None else "none")
            + "\n  suite tune FILE --report  for figures and the table")
        return summary



def _drive(study, spec: TuneSpec, dists: dict, pending: dict, queue: list, n_target: int, submit, drv,
           tracking_uri: str, out, t0: float) -> None:
    """Keep `spec.parallelism` trials running until the study holds `n_target` started trials and
    every job has been told; `drv.hold()` keeps a stop signal out of a submission."""
    optuna = _optuna()
    from optuna.trial import TrialState

    last_note = t0
    while True:
        for number, job in list(pending.items()):
            if job.done():
                del pending[number]
                _finish(study, number, job, tracking_uri, spec, out)
        trials = study.get_trials(deepcopy=False)
        started = sum(t.state != TrialState.WAITING for t in trials)
        while len(pending) < spec.parallelism and (queue or started < n_target):
            if queue:
                t = queue.pop(0)
                number, trial_id, params = t.number, t._trial_id, _complete_params(study, t, dists)
            else:
                trial = study.ask(dists)
                number, trial_id, params = trial.number, trial._trial_id, trial.params
                started += 1
            optuna.trial.Trial(study, trial_id).set_user_attr("run_dir", trial_dir(spec, number))
            with drv.hold():
                job = submit(number, trial_id, params)
                pending[number] = job
            out(f"trial {number}: started ({_fmt_params(params)}), job {job.job_id}")
        if not pending:
            break
        if time.perf_counter() - last_note >= PROGRESS_EVERY_S:
            out(_progress_line(spec, trials, pending, n_target, t0, TrialState))
            last_note = time.perf_counter()
        time.sleep(spec.poll_s)


def _progress_line(spec: TuneSpec, trials: list, pending: dict, n_target: int, t0: float, states) -> str:
    """The study's aggregate (suite.launch.progress): trials done / running / failed, elapsed, ETA."""
    from suite.launch.progress import aggregate_line

    done = sum(t.state in (states.COMPLETE, states.PRUNED) for t in trials)
    failed = sum(t.state == states.FAIL for t in trials)
    queued = max(n_target - done - failed - len(pending), 0)
    return aggregate_line(f"suite tune {spec.study}", n_target, done, len(pending), failed, queued,
                          time.perf_counter() - t0, float(done + failed), n_target) + \
        f" (running: {', '.join(map(str, sorted(pending)))})"


def _finish(study, number: int, job, tracking_uri: str, spec: TuneSpec, out) -> None:
    """Tell Optuna a finished job's result and mark the trial's MLflow child run."""
    from optuna.trial import TrialState

    try:
        r = job.result()
    except Exception as exc:  # noqa: BLE001 - a failed trial is recorded, the study goes on
        msg = _error_line(str(exc)) or type(exc).__name__
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        mlflow_id = recorded_mlflow_run_id(trial_dir(spec, number))
        _mark_child(tracking_uri, mlflow_id, "FAIL", None)
        out(f"trial {number}: FAILED: {msg[:300]} (log: {job.paths.stderr})")
        return
    if r["mlflow_run_id"]:
        _set_attr(study, number, "mlflow_run_id", r["mlflow_run_id"])
    if r["pruned"]:
        ft = study.tell(number, state=TrialState.PRUNED, skip_if_finished=True)
        _mark_child(tracking_uri, r["mlflow_run_id"], "PRUNED", ft.value)
        out(f"trial {number}: pruned at step {r['step']} (held-out acc {r['final_acc']:.4f})")
    elif r["value"] is None:
        study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        _mark_child(tracking_uri, r["mlflow_run_id"], "FAIL", None)
        out(f"trial {number}: FAILED: the run logged no finite {spec.objective.metric}")
    else:
        study.tell(number, r["value"], skip_if_finished=True)
        _mark_child(tracking_uri, r["mlflow_run_id"], "COMPLETE", r["value"])
        best = study.best_trial
        out(f"trial {number}: {spec.objective.metric} = {r['value']:.4f} at step {r['step']} "
            f"(best: trial {best.number}, {best.value:.4f})")


def _complete_params(study, frozen, dists: dict) -> dict:
    """The parameters of a RUNNING trial, suggesting any that a driver killed inside `study.ask`
    had not recorded yet (an enqueued trial keeps its fixed values)."""
    optuna = _optuna()
    missing = [k for k in dists if k not in frozen.params]
    if not missing:
        return dict(frozen.params)
    trial = optuna.trial.Trial(study, frozen._trial_id)
    for name in missing:
        d = dists[name]
        if isinstance(d, optuna.distributions.CategoricalDistribution):
            trial.suggest_categorical(name, d.choices)
        elif isinstance(d, optuna.distributions.IntDistribution):
            trial.suggest_int(name, d.low, d.high, step=d.step, log=d.log)
        else:
            trial.suggest_float(name, d.low, d.high, step=d.step, log=d.log)
    return {k: trial.params[k] for k in dists}


def _error_line(text: str) -> str:
    """The 'SomeError: message' line of a job's traceback (submitit puts it in the exception text)."""
    import re

    lines = [ln.strip() for ln in text.splitlines()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b", ln):
            return ln
    return lines[0] if lines else ""


def _set_attr(study, number: int, key: str, value) -> None:
    optuna = _optuna()
    frozen = study.get_trials(deepcopy=False)[number]
    if not frozen.state.is_finished():  # user attributes of a finished trial are frozen
        optuna.trial.Trial(study, frozen._trial_id).set_user_attr(key, value)


def _reconcile(study, tracking_uri: str, out) -> None:
    """After a crash between telling Optuna and tagging MLflow: tag finished trials' child runs."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL):
            rid = t.user_attrs.get("mlflow_run_id") or recorded_mlflow_run_id(t.user_attrs.get("run_dir", ""))
            if not rid:
                continue
            try:
                tags = _client(tracking_uri).get_run(rid).data.tags
            except Exception:  # noqa: BLE001 - a run on another store: nothing to fix here
                continue
            if tags.get(STATE_TAG) != t.state.name:
                _mark_child(tracking_uri, rid, t.state.name, t.value)
                out(f"trial {t.number}: MLflow run {rid} tagged {STATE_TAG}={t.state.name} (missed by a crash)")


def _summary(study, spec: TuneSpec, storage_url: str, parent: str) -> dict:
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    count = lambda s: sum(t.state == s for t in trials)  # noqa: E731
    best = None
    if count(TrialState.COMPLETE):
        best = study.best_trial
    return {
        "study": spec.study, "storage": storage_url, "parent_run_id": parent,
        "n_complete": count(TrialState.COMPLETE), "n_pruned": count(TrialState.PRUNED),
        "n_failed": count(TrialState.FAIL),
        "best_number": best.number if best else None, "best_value": best.value if best else None,
        "best_params": dict(best.params) if best else {},
    }


def trial_rows(study) -> list[dict]:
    """One dict per trial: number, state, value, params, last reported step, MLflow run id."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        steps = sorted(t.intermediate_values)
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value,
            **{f"params_{k}": v for k, v in t.params.items()},
            "last_step": steps[-1] if steps else None,
            "duration_s": t.duration.total_seconds() if t.duration else None,
            "mlflow_run_id": t.user_attrs.get("mlflow_run_id"),
        })
    return rows
