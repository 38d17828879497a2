"""`suite tune FILE --report`: best trial, parameter importances, optimisation history.

Writes into ``<out_dir>/<study>/report/`` (or ``--report-dir``):

    trials.csv, trials.md        one row per trial: number, state, value, params, last step, MLflow run
    importances.csv              parameter importance (Optuna's default evaluator, PED-ANOVA: numpy only)
    best.json                    best trial number, value, params
    history.png                  optuna.visualization.matplotlib.plot_optimization_history
    importances.png              ... plot_param_importances
    intermediate.png             ... plot_intermediate_values (held-out accuracy per step; pruned trials end early)
    slice.png                    ... plot_slice
    contour.png                  ... plot_contour (two or more parameters)

and logs the directory to the study's MLflow parent run (artifacts ``tune_report/``), with
the best value as metric ``best_value`` and the best parameters as tags ``best.<key>``.
"""

from __future__ import annotations

import csv
import json
import math
import time
import warnings
from pathlib import Path

from suite.tune.spec import TuneSpec
from suite.tune.study import PARENT_ATTR, URI_ATTR, open_study, resolve_storage, study_dir, trial_rows


def _markdown(rows: list[dict], cols: list[str]) -> str:
    def cell(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.4g}" if math.isfinite(v) else str(v)
        return str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _save(ax_or_axes, path: Path) -> None:
    import matplotlib.pyplot as plt

    ax = ax_or_axes
    while hasattr(ax, "flat"):  # an array of axes (slice, contour): any one gives the figure
        ax = ax.flat[0]
    fig = ax.figure
    fig.set_size_inches(max(fig.get_size_inches()[0], 7), max(fig.get_size_inches()[1], 4.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_report(spec: TuneSpec, report_dir: str | None = None, *, out=None) -> dict:
    """Write the report files and log them to MLflow; returns {best, importances, files, report_dir}."""
    import matplotlib

    matplotlib.use("Agg")
    import optuna
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as ovm

    out = out or (lambda msg: print(msg, flush=True))
    study = open_study(spec, resolve_storage(spec.storage), create=False)
    rdir = Path(report_dir) if report_dir else study_dir(spec) / "report"
    rdir.mkdir(parents=True, exist_ok=True)
    rows = trial_rows(study)
    if not rows:
        raise ValueError(f"study {spec.study!r} has no trials yet: run `suite tune FILE` first")
    cols = list(dict.fromkeys(k for r in rows for k in r))
    with open(rdir / "trials.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    (rdir / "trials.md").write_text(_markdown(rows, cols))
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    files = ["trials.csv", "trials.md"]
    best = None
    if complete:
        b = study.best_trial
        best = {"number": b.number, "value": b.value, "params": dict(b.params), "metric": spec.objective.metric,
                "direction": spec.objective.direction, "mlflow_run_id": b.user_attrs.get("mlflow_run_id")}
    (rdir / "best.json").write_text(json.dumps(best, indent=2) + "\n")
    files.append("best.json")

    importances: dict[str, float] = {}
    plots = [("history.png", ovm.plot_optimization_history), ("intermediate.png", ovm.plot_intermediate_values),
             ("slice.png", ovm.plot_slice)]
    if len(complete) >= 2:
        try:
            importances = optuna.importance.get_param_importances(study)
            plots.insert(1, ("importances.png", ovm.plot_param_importances))
        except (RuntimeError, ValueError) as exc:  # e.g. every complete trial has the same value
            out(f"parameter importances not computed: {exc}")
    if len(spec.space) >= 2 and len(complete) >= 2:
        plots.append(("contour.png", ovm.plot_contour))
    with open(rdir / "importances.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["param", "importance"])
        w.writerows(importances.items())
    files.append("importances.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna's matplotlib backend is marked experimental
        for name, fn in plots:
            try:
                _save(fn(study), rdir / name)
                files.append(name)
            except (ValueError, RuntimeError) as exc:
                out(f"{name} not drawn: {exc}")

    parent = study.user_attrs.get(PARENT_ATTR)
    uri = study.user_attrs.get(URI_ATTR)
    if parent and uri:
        from mlflow.entities import Metric, RunTag
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        client.log_artifacts(parent, str(rdir), artifact_path="tune_report")
        tags = [RunTag("best_trial", str(best["number"]))] if best else []
        if best:
            tags += [RunTag(f"best.{k}", str(v)) for k, v in best["params"].items()]
        metrics = [Metric("best_value", best["value"], int(time.time() * 1000), len(rows))] if best else []
        metrics += [Metric(f"importance/{k}", v, int(time.time() * 1000), len(rows)) for k, v in importances.items()]
        client.log_batch(parent, metrics=metrics, tags=tags)
    n_by = {s: sum(r["state"] == s for r in rows) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING")}
    out(f"study {spec.study}: {len(rows)} trials ({', '.join(f'{v} {k.lower()}' for k, v in n_by.items() if v)})")
    out(_markdown(rows, cols))
    if best:
        out(f"best: trial {best['number']}: {spec.objective.metric} = {best['value']:.4f} with "
            + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in best["params"].items()))
    if importances:
        out("importances: " + ", ".join(f"{k} {v:.3f}" for k, v in importances.items()))
    out(f"report: {rdir} ({', '.join(files)})"
        + (f"; logged to MLflow run {parent} under tune_report/" if parent else ""))
    return {"best": best, "importances": importances, "files": files, "report_dir": str(rdir)}

