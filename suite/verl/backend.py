"""The verl backend as a `suite.backend.Backend`: `suite.verl.runner.run` in a run directory."""

from __future__ import annotations

from omegaconf import DictConfig

from suite.contract import OnEval, OpenRun, RunSummary


def run(cfg: DictConfig, run_dir: str, on_eval: OnEval | None = None, *, progress: bool = False,
        open_run: OpenRun | None = None) -> RunSummary:
    """Train `cfg` with verl in `run_dir`. verl evaluates inside main_ppo, so there is no
    `on_eval` hook (tuning, which prunes through it, runs embedded trials only)."""
    if on_eval is not None:
        raise ValueError("backend.name=verl has no on_eval hook (verl evaluates inside main_ppo); "
                         "runs that prune on held-out accuracy need backend=embedded")
    from suite.config import run_id
    from suite.verl.runner import run as verl_run

    record = verl_run(cfg, run_dir, open_run=open_run)
    # the head's summary.json has every field but the run's identity, which is the config's
    return RunSummary.from_record(record, run_id=run_id(cfg), run_dir=run_dir, steps=int(cfg.steps),
                                  mlflow_run_id=None, tracking_uri=str(cfg.tracking.tracking_uri))


def command(cfg: DictConfig, run_dir: str, overrides: list[str]) -> list[str]:
    """verl's `main_ppo` command for `cfg` (suite.verl.translate); a broken verl install gives a
    placeholder, so a dry run still lists the other cells."""
    try:
        from suite.verl.translate import verl_command
    except ImportError as exc:
        return [f"<verl translator unavailable: {exc}>"]
    return list(verl_command(cfg, run_dir))


def missing(cfg: DictConfig) -> str | None:
    """What the environment lacks to run `cfg` (verl and vLLM, looked up by `backend.python`,
    the interpreter that runs verl's trainer), in one line; None when nothing."""
    from suite.verl.install import missing_install

    return missing_install(str(cfg.backend.python))
