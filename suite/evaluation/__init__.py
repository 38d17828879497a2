"""`suite eval`: a trained policy scored per benchmark, the papers' way.

The papers compare trained policies, scored in BF16, per benchmark: GSM8K greedy pass@1, AIME 2024
Avg@32, each DeepScaleR / QaRL benchmark on its own (QuRL arXiv 2602.13953 Tables 1-3, QaRL arXiv
2604.07853 Table 1; docs/eval.md). A run's in-training validation is neither on the verl backend:
verl validates with its rollout engine, the INT8 / FP8 / W4A16 copy, and averages nothing per
benchmark by itself. So a run's checkpoint is scored here by two engines:

- ``bf16`` (verl: the FSDP checkpoint merged by verl's model merger, served by vLLM in bf16; embedded:
  the checkpoint's actor on the suite's bf16 engine), and ``fp32`` on the embedded backend (its
  trainer's own precision, what its in-training validation scores);
- ``rollout``: the run's quantized rollout engine on the same weights, so the engine's own error is
  the difference between the two rows.

Each benchmark is scored by its protocol (`Protocol`: samples per prompt, temperature, top_p, the
response budget), the run's validation settings (a recipe's: greedy pass@1 for GSM8K and QaRL,
Avg@32 at the recipe's temperature and top_p for QuRL's AIME and DeepScaleR tables), with the run's
own scorer (suite.verl.reward or the run's reward file; an embedded task's exact-answer verify).

Results land in the run directory (``eval/step_<N>.json``: every benchmark x engine x protocol
scored from that checkpoint, with the grader's name and version) and in the run's MLflow run as
``eval/<benchmark>/<engine>/acc/mean@k`` at step N (``@`` is MLflow's ``_at_``), the grader as the tag
``eval/<benchmark>/grader``. Re-running is idempotent: a scored (benchmark, engine,
protocol) is read back, not recomputed, and only values MLflow lacks are sent (so a run scored during
a tracking outage is sent by the next call).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

EVAL_DIR = "eval"  # inside the run directory
ENGINES = ("bf16", "fp32", "rollout")  # --precision choices; fp32: the embedded backend only
CHECKPOINTS = ("last", "best")  # --checkpoint choices, besides a step number


class EvalError(ValueError):
    """Bad input to `suite eval` (one line naming the value and what is allowed): exit 2, nothing written."""


@dataclass(frozen=True)
class Protocol:
    """How one benchmark is sampled: ``samples`` responses per prompt (1 = pass@1), at ``temperature``
    (0 = greedy) and ``top_p``, each at most ``max_new_tokens`` long."""

    samples: int
    temperature: float
    top_p: float
    max_new_tokens: int

    @property
    def metric(self) -> str:
        """verl's name of the mean over prompts and samples: ``mean@k``."""
        return f"mean@{self.samples}"

    def describe(self) -> str:
        how = "greedy" if self.temperature == 0 else f"T={self.temperature:g}, top_p={self.top_p:g}"
        what = "pass@1" if self.samples == 1 else f"Avg@{self.samples}"
        return f"{what} ({how}, <= {self.max_new_tokens} new tokens)"


@dataclass(frozen=True)
class Score:
    """One benchmark scored by one engine from one checkpoint."""

    benchmark: str  # verl: the data_source; embedded: <task>-d<difficulty>
    engine: str  # bf16 | fp32 | rollout
    engine_detail: str  # what ran: e.g. "vLLM bf16", "vLLM compressed-tensors W8A8 int8", "embedded int8 native"
    protocol: Protocol
    step: int  # the checkpoint's RL step
    n_prompts: int
    n_correct: int  # right answers of what `metric` counts: prompts x samples (mean@k), prompts (mean@1, pass@k)
    acc: float  # n_correct over that count
    seconds: float  # wall time of the scoring
    grader: str = ""  # what graded the answers, name (version): a number is published only beside its grader
    # what acc is, from the protocol's samples: "" = mean@k over all k (the protocol's own metric); "mean@1" = the
    # first sample of each prompt only (Avg@1 at the protocol's temperature); "pass@k" = any of the k right
    metric: str = ""

    @property
    def metric_name(self) -> str:
        return self.metric or self.protocol.metric

    @property
    def key(self) -> str:
        """The MLflow metric key (before MLflow's `@` -> `_at_`)."""
        return f"eval/{self.benchmark}/{self.engine}/acc/{self.metric_name}"

    def to_record(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: dict) -> "Score":
        return cls(**{**record, "protocol": Protocol(**record["protocol"])})

    def same_job(self, other: "Score") -> bool:
        return (self.benchmark, self.engine, self.protocol, self.step, self.metric_name) == (
            other.benchmark, other.engine, other.protocol, other.step, other.metric_name)


def results_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / EVAL_DIR / f"step_{step:08d}.json"


def read_results(run_dir: str | os.PathLike, step: int) -> list[Score]:
    """The scores already written for checkpoint ``step`` (empty when none), parsed by their schema
    (suite.schemas.EvalResultsFile): a damaged or foreign file is an EvalError naming the field."""
    from suite.schemas import EvalResultsFile, SchemaError, read_json

    path = results_path(run_dir, step)
    try:
        doc = read_json(EvalResultsFile, path)
    except FileNotFoundError:
        return []
    except SchemaError as exc:
        detail = str(exc).removeprefix(f"{path}: ")
        raise EvalError(f"{path}: not a suite eval result file ({detail}); move it aside to score again") from None
    if doc.step != step:
        raise EvalError(f"{path}: not a suite eval result file (step: {doc.step}, but the file is checkpoint "
                        f"{step}'s); move it aside to score again")
    names = {f.name for f in dataclasses.fields(Score)}
    return [Score.from_record({k: v for k, v in s.model_dump().items() if k in names}) for s in doc.scores]


def write_results(run_dir: str | os.PathLike, step: int, scores: list[Score]) -> Path:
    """Merge ``scores`` into the checkpoint's result file (a newer score of the same job replaces
    the older), atomically."""
    from suite.tracking.atomic import atomic_write

    kept = [s for s in read_results(run_dir, step) if not any(s.same_job(n) for n in scores)]
    path = results_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"step": step, "scores": [s.to_record() for s in kept + scores]}
    atomic_write(path, lambda fh: fh.write((json.dumps(body, indent=1) + "\n").encode()))
    return path


def log_to_mlflow(tracking_uri: str, mlflow_run_id: str, scores: list[Score]) -> tuple[int, str]:
    """Send each score MLflow lacks (its key at its step) to the run; (how many were sent, the
    problem or ""). The run's status is left as it is; an unreachable server answers in seconds."""
    from suite.tracking.outage import LIVE_HTTP_ENV, http_env

    try:
        with http_env(LIVE_HTTP_ENV):
            return _send(tracking_uri, mlflow_run_id, scores), ""
    except Exception as exc:  # noqa: BLE001 - the results are in the run dir; the next call sends them
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return 0, f"{type(exc).__name__}: {first}"


def _send(tracking_uri: str, mlflow_run_id: str, scores: list[Score]) -> int:
    import time

    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    from suite.tracking.mlflow_logger import mlflow_metric_key  # MLflow's spelling: `@` as `_at_`

    client = MlflowClient(tracking_uri)
    missing = []
    for s in scores:
        key = mlflow_metric_key(s.key)
        have = client.get_metric_history(mlflow_run_id, key)
        if not any(m.step == s.step and math.isclose(m.value, s.acc, rel_tol=0, abs_tol=1e-12) for m in have):
            missing.append(Metric(key, float(s.acc), int(time.time() * 1000), s.step))
    # the grader of each benchmark as a tag (eval/<benchmark>/grader), beside the numbers it produced
    tags = [RunTag(f"eval/{s.benchmark}/grader", s.grader) for s in scores if s.grader]
    if missing or tags:
        client.log_batch(mlflow_run_id, metrics=missing, tags=list({t.key: t for t in tags}.values()))
    return len(missing)


__all__ = ["CHECKPOINTS", "ENGINES", "EVAL_DIR", "EvalError", "Protocol", "Score", "log_to_mlflow", "read_results",
           "results_path", "write_results"]
