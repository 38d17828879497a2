"""The MLflow logger's outage state machine: an unreachable tracking store never stops training.

States: *up*; *failing* (an outage: warned once, the work is kept by the logger and retried
only at the next flush, which pays for the retry); *disabled* (the store answered and refused
the run's set-up, a 4xx: retrying cannot help, so MLflow logging is off for the run and
metrics.jsonl keeps everything). In sync mode (`suite sync`) every error raises instead.

The HTTP settings are MLflow's own environment variables, set around our calls only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping

log = logging.getLogger(__name__)

# mlflow 3.17.2 reads these on every request (mlflow/utils/rest_utils.py `http_request`), so
# setting them around our own calls is enough. Its defaults (7 retries, backoff factor 2,
# 120 s timeout) make one call to a dead server hang for minutes. While training we try
# once with a 2 s connect/read timeout (the variable is an int: 1 s is too tight for a
# 1000-metric batch on a busy sqlite server) and rely on the next flush to retry. A variable
# the user has set in the environment is left alone.
LIVE_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "2",
}
# `suite sync` is run by hand when the server is believed up: a few retries (1, 2, 4 s
# backoff) ride out a restart without hanging for minutes if it is still down.
SYNC_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
}

# A verb's own calls (`suite sweep`'s parent run, `suite status`, `suite report`, `suite tune`,
# `suite eval`): two tries, 1 s apart (plus MLflow's jitter), 4 s each, so a dead server is
# named within ~10 s instead of after minutes. A live server answers these in milliseconds.
VERB_HTTP_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "4",
}


class StoreUnreachable(RuntimeError):
    """The tracking store did not answer a verb's first call; the message names its URI."""


def check_store(uri: str, *, verb: str) -> None:
    """Raise StoreUnreachable, naming `uri`, when an HTTP tracking server does not answer one
    small request within VERB_HTTP_ENV's bounds (~10 s). Local stores (sqlite, file) are
    checked by the verbs themselves (a missing file is a typo, not an outage)."""
    if not uri.startswith(("http://", "https://")):
        return
    from mlflow.tracking import MlflowClient

    try:
        with http_env(VERB_HTTP_ENV):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as e:  # noqa: BLE001 - any failure of the first call: the store is not usable
        first = (str(e).splitlines() or [""])[0][:200]
        what = "refused the request" if is_rejection(e) else "does not answer"
        raise StoreUnreachable(f"the MLflow tracking server at {uri} {what} ({type(e).__name__}: {first}); "
                               f"{verb} needs it: start it, or point --tracking-uri / MLFLOW_TRACKING_URI at "
                               "a store that answers") from None


@contextlib.contextmanager
def bounded_http() -> Iterator[None]:
    """A verb's MLflow calls under VERB_HTTP_ENV (those the user has not set)."""
    with http_env(VERB_HTTP_ENV):
        yield


@contextlib.contextmanager
def http_env(env: Mapping[str, str]) -> Iterator[None]:
    """Set MLflow HTTP variables the user has not set, for the duration of our calls only,
    so other MLflow use in the process keeps its own (patient) defaults."""
    added = [k for k in env if k not in os.environ]
    for k in added:
        os.environ[k] = env[k]
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


# --------------------------------------------------------------------------- JSONL

def is_rejection(e: BaseException) -> bool:
    """True when the store answered and refused the request (4xx): sending it again cannot
    succeed. Anything else (connection refused, timeout, 5xx, sqlite locked) is an outage."""
    from mlflow.exceptions import MlflowException

    if isinstance(e, (FileNotFoundError, IsADirectoryError)):
        return True
    return isinstance(e, MlflowException) and 400 <= e.get_http_status_code() < 500



class Outage:
    """Runs the logger's sends (`attempt`) and tracks whether the store is up, failing or
    refused the run (module docstring). `sync_mode`: patient HTTP settings, errors raise."""

    def __init__(self, tracking_uri: str, *, sync_mode: bool = False):
        self.tracking_uri = tracking_uri
        self.sync_mode = sync_mode
        self.http = SYNC_HTTP_ENV if sync_mode else LIVE_HTTP_ENV
        self.failing = False  # inside an outage: warned already; only a flush retries
        self.disabled: str | None = None  # the store refused the run's set-up: never send again

    def attempt(self, send: Callable[[], None], *, flush: bool, run_ready: bool,
                pending: Callable[[], int]) -> None:
        """Call `send` unless disabled, or failing and this is not a `flush`. A failure never
        raises (except in sync mode): a rejection before the run is ready (`run_ready`)
        disables the logger, anything else is an outage, warned once with `pending()` metrics."""
        if self.disabled:
            return
        if self.failing and not flush:
            return  # during an outage only flush() pays for a retry
        try:
            with http_env(self.http):
                send()
        except Exception as e:  # noqa: BLE001 - never raise into training
            if self.sync_mode:
                raise
            if is_rejection(e) and not run_ready:
                self.disabled = f"{type(e).__name__}: {e}"
                log.error(
                    "MLflow refused run setup at %s, MLflow logging is off for this run "
                    "(metrics.jsonl still has everything): %s", self.tracking_uri, e,
                )
                return
            if not self.failing:
                log.warning(
                    "MLflow at %s is unreachable (%s: %s); %d metrics kept in memory and in "
                    "metrics.jsonl, retried at every flush (or later: `suite sync RUN_DIR`)",
                    self.tracking_uri, type(e).__name__, str(e).splitlines()[0][:300], pending(),
                )
                self.failing = True
            return
        if self.failing:
            log.warning("MLflow at %s is reachable again", self.tracking_uri)
            self.failing = False
