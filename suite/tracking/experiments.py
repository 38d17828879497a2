"""MLflow experiments and tagged runs: the one place that finds-or-creates an experiment and
creates a run in it, for the run loggers, the sweep's parent run and the tuning study's.

Every caller goes through `MlflowClient` (no fluent global state), so several runs can be
created from one process.
"""

from __future__ import annotations

from collections.abc import Mapping


def experiment_id(client, name: str, *, create: bool = True, artifact_location: str | None = None) -> str | None:
    """The id of experiment `name`, created (with `artifact_location`) when missing and
    `create`; None when missing and not `create`. Two processes that create it at once (the
    cells of a sweep starting together) both get the one that won."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    if not create:
        return None
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        exp = client.get_experiment_by_name(name)  # another process created it first
        if exp is None:
            raise
        return exp.experiment_id


def create_run(client, experiment: str, *, run_name: str | None, tags: Mapping[str, str],
               artifact_location: str | None = None):
    """A new RUNNING run named `run_name` in experiment `experiment` (found or created), created
    with `tags` (so a search by tag finds it from its first instant); returns MLflow's `Run`."""
    exp_id = experiment_id(client, experiment, artifact_location=artifact_location)
    return client.create_run(exp_id, tags=dict(tags), run_name=run_name)
