"""MLflow experiments and tagged runs: the one place that finds-or-creates an experiment and
creates a run in it, for the run loggers, the sweep's parent run and the tuning study's.

Every caller goes through `MlflowClient` (no fluent global state), so several runs can be
created from one process. `MlflowClient.create_run` adds no context of its own (the fluent
`mlflow.start_run` does), so `create_run` adds MLflow's standard source tags here
(`context_tags`), and `experiment_id` marks each experiment it creates as model training.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping

# MLflow 3's UI opens an experiment on its GenAI "Traces" page unless this tag says the
# experiment is for model training (the value the UI's experiment-kind selector writes).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
SOURCE_NAME_TAG = "mlflow.source.name"
GIT_COMMIT_TAG = "mlflow.source.git.commit"


def experiment_id(client, name: str, *, create: bool = True, artifact_location: str | None = None) -> str | None:
    """The id of experiment `name`, created (with `artifact_location`, tagged as a model-training
    experiment) when missing and `create`; None when missing and not `create`. Two processes that
    create it at once (the cells of a sweep starting together) both get the one that won. An
    existing experiment without a kind tag gets it (one that has a kind keeps it)."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if create and EXPERIMENT_KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    if not create:
        return None
    try:
        return client.create_experiment(name, artifact_location=artifact_location,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except MlflowException:
        exp = client.get_experiment_by_name(name)  # another process created it first
        if exp is None:
            raise
        return exp.experiment_id


def suite_command(argv: list[str] | None = None) -> str:
    """What started this process, as a user would type it: `suite <verb> ...` for the suite's
    command line (console script or `python -m suite`), else the script's path."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not argv[0]:
        return "<console>"
    head = os.path.basename(argv[0])
    if head == "suite" or argv[0].endswith((os.path.join("suite", "__main__.py"), os.path.join("suite", "cli.py"))):
        return " ".join(["suite", *argv[1:]])[:500]
    return argv[0]


@functools.lru_cache(maxsize=8)
def _git_tags(paths: tuple[str, ...]) -> dict[str, str]:
    """MLflow's git tags (commit, branch, repo URL) of the first of `paths` inside a git checkout
    (cached: a process that creates many runs opens the repository once)."""
    from mlflow.utils.git_utils import get_git_branch, get_git_commit, get_git_repo_url
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_BRANCH, MLFLOW_GIT_REPO_URL

    for path in paths:
        commit = get_git_commit(path)
        if commit:
            found = {GIT_COMMIT_TAG: commit, MLFLOW_GIT_BRANCH: get_git_branch(path),
                     MLFLOW_GIT_REPO_URL: get_git_repo_url(path)}
            return {k: v for k, v in found.items() if v}
    return {}


def context_tags(source_name: str | None = None) -> dict[str, str]:
    """MLflow's standard run context: `mlflow.user`, `mlflow.source.type`, `mlflow.source.name`
    (`source_name`, else `suite_command()`) and, when the suite's code or the working directory is
    a git checkout, `mlflow.source.git.commit` / `.branch` / `.repoURL`.

    MLflow's own providers (`mlflow.tracking.context.registry.resolve_tags`, what `mlflow.start_run`
    calls) supply the user and source type; its git provider looks at `sys.argv[0]`, which for the
    `suite` console script or a submitit job is outside any checkout, so the commit is looked up
    from the suite package's directory, then the working directory. These helpers are MLflow's
    plugin-facing modules, not its client API: where a version lacks them, the user and source
    type are set here and the commit is left out."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        from mlflow.tracking.context.git_context import GitRunContext
        from mlflow.tracking.context.registry import resolve_tags

        tags = {str(k): str(v) for k, v in resolve_tags(ignore=[GitRunContext]).items()}
        tags.update(_git_tags((package_dir, os.getcwd())))
    except ImportError:
        import getpass

        tags = {"mlflow.user": getpass.getuser(), "mlflow.source.type": "LOCAL"}
    tags[SOURCE_NAME_TAG] = source_name or suite_command()
    return tags


def create_run(client, experiment: str, *, run_name: str | None, tags: Mapping[str, str],
               artifact_location: str | None = None):
    """A new RUNNING run named `run_name` in experiment `experiment` (found or created), created
    with MLflow's context tags (`context_tags`) and `tags` (which win), so a search by tag finds it
    from its first instant; returns MLflow's `Run`."""
    exp_id = experiment_id(client, experiment, artifact_location=artifact_location)
    tags = dict(tags)
    return client.create_run(exp_id, tags={**context_tags(tags.get(SOURCE_NAME_TAG)), **tags}, run_name=run_name)


# MLflow 3.17's UI decides between its GenAI and model-training views by a `workflowType` query
# parameter, else by the browser's last choice (GenAI at first); the experiment-kind tag above is
# not read by that version. A link with the parameter opens the runs table in any browser.
UI_VIEW = "workflowType=machine_learning"
UI_DEFAULT = "http://127.0.0.1:5000"  # where `mlflow ui` serves by default
SERVED = ("http://", "https://")  # tracking URIs of a server, which serves the UI at the same address


def ui_link(tracking_uri: str, experiment_id: str, run_id: str | None = None) -> str:
    """The MLflow UI's page of an experiment (or of one of its runs), in the model-training view.

    A tracking server (http/https URI) serves the UI at its own address; for any other store
    the link is where `mlflow ui --backend-store-uri <store>` serves it by default."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(SERVED) else UI_DEFAULT
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base}/{page}?{UI_VIEW}"


def ui_hint(tracking_uri: str, mlflow_run_id: str | None) -> str:
    """One line that says where to see `mlflow_run_id` in the MLflow UI (and, for a store
    without a server, the command that starts one), or only that command when the run cannot be
    looked up (no run, or the store does not answer)."""
    served = tracking_uri.startswith(SERVED)
    start = f"mlflow ui --backend-store-uri {tracking_uri}"
    if mlflow_run_id:
        try:
            from mlflow import MlflowClient

            from suite.tracking.outage import LIVE_HTTP_ENV, http_env

            with http_env(LIVE_HTTP_ENV):  # one try, 2 s: a dead server must not hold the last line
                exp = MlflowClient(tracking_uri).get_run(mlflow_run_id).info.experiment_id
            link = ui_link(tracking_uri, exp, mlflow_run_id)
            return link if served else f"{start}, then open {link}"
        except Exception:  # an outage or a removed run: the summary line must still print
            pass
    return tracking_uri if served else start
