"""The backend contract's types: `RunSummary`, the `Backend` protocol and the callables a backend
is handed (`OnEval`, `OpenRun`). A module of its own below suite.backend: suite.backend loads the
backends by name, and a backend that imported suite.backend for these types would import its
caller back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from omegaconf import DictConfig

OnEval = Callable[[int, float], bool]
"""on_eval(step, held-out accuracy) -> True to stop the run there (pruned); after each evaluation."""

OpenRun = Callable[..., Any]
"""open_run(tags=None, catch_up=True) -> the cell's MLflow run as a `suite.tracking.MlflowLogger`
(created, or resumed from the run dir's record), `tags` added to the cell's own. The caller
(suite.cell.run_cell) hands it to the backend, which opens the run once its refusals are past;
None: the backend opens the same run itself (suite.tracking.cell_run.opener)."""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What a finished (or pruned) run reports, the same fields for every backend.

    The run directory's summary.json keeps each backend's own record (its keys are read back
    with `from_record`); this is the in-memory contract between backends and their callers.
    """

    run_id: str  # suite run id (suite.config.run_id): the run dir's name
    run_dir: str
    steps: int  # RL steps of the run (verl: the last evaluated step)
    baseline_acc: float  # held-out accuracy before RL (step 0)
    final_acc: float  # held-out accuracy at the last evaluation
    delta_acc: float  # final_acc - baseline_acc
    mlflow_run_id: str | None  # None: MLflow never accepted the run (metrics.jsonl has it all)
    tracking_uri: str
    pruned: bool = False  # stopped early by on_eval (the MLflow run ended KILLED)
    already_finished: bool = False  # summary.json was there: nothing ran in this call
    wall_s_this_session: float | None = None  # seconds this call trained (None: not measured)
    metric_keys: list[str] = dataclasses.field(default_factory=list)  # held-out metrics averaged (verl)

    @classmethod
    def from_record(cls, record: Mapping[str, Any], **fill: Any) -> RunSummary:
        """A summary from a summary.json record; `fill` gives fields the record lacks."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {**fill, **{k: v for k, v in record.items() if k in names}}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Backend(Protocol):
    """Train `cfg` in `run_dir` (resuming it, or returning at once when it finished)."""

    def __call__(self, cfg: DictConfig, run_dir: str, on_eval: OnEval | None = None, *,
                 progress: bool = False, open_run: OpenRun | None = None) -> RunSummary: ...
