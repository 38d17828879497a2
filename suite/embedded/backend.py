"""The embedded backend as a `suite.backend.Backend`: `EmbeddedRun` in a run directory."""

from __future__ import annotations

from omegaconf import DictConfig

from suite.contract import OnEval, OpenRun, RunSummary


def run(cfg: DictConfig, run_dir: str, on_eval: OnEval | None = None, *, progress: bool = False,
        open_run: OpenRun | None = None) -> RunSummary:
    """Train `cfg` with the embedded trainer in `run_dir` (resume, or the finished summary), logging
    to the MLflow run `open_run` opens."""
    from suite.embedded.trainer import EmbeddedRun

    return RunSummary.from_record(EmbeddedRun(cfg, run_dir, progress=progress, on_eval=on_eval,
                                              open_run=open_run).run())


def warm_start(cfg: DictConfig, *, progress: bool = False) -> dict:
    """The run's warm start from its cache, trained and cached first where missing; its info."""
    import tempfile

    from suite.embedded.trainer import EmbeddedRun

    with tempfile.TemporaryDirectory(prefix="suite-warm-start-") as scratch:  # EmbeddedRun's run dir: unused
        return EmbeddedRun(cfg, scratch, progress=progress).load_warm_start()[1]


def command(cfg: DictConfig, run_dir: str, overrides: list[str]) -> list[str]:
    """`suite run <overrides>`: the overrides that compose `cfg` reproduce the run."""
    return ["suite", "run", *overrides]
