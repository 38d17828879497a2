"""Declared schemas of the files the suite reads back, and one way to read them.

A file written by one verb and read by another (a run's records, `suite eval`'s results, `suite bench
vllm`'s results) is parsed by its pydantic model here, never indexed into as a dict: a damaged or foreign
file is refused in one line that names the file, the field and what was expected,

    runs/r1/eval/step_00000010.json: scores.0.engine: must be 'bf16', 'fp32' or 'rollout', got 'int8'

and the caller turns that line into exit status 2 before it writes anything. `SCHEMAS` lists every file
read this way with its model (docs/architecture.md, "Files and their schemas", is generated from it).
Text a model wrote is data here too: nothing is evaluated, only parsed.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, field_validator


class SchemaError(ValueError):
    """A file that does not match its schema; str() is the one line to print."""


class _Record(BaseModel):
    # fields a newer suite adds are kept (extra="allow") so an older reader does not refuse them;
    # types are checked strictly: "fast" is no number and 1.0 no step
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


# ------------------------------------------------------------------------------ suite eval results

class ProtocolRecord(_Record):
    """How a benchmark was scored (suite.evaluation.Protocol)."""
    samples: int = Field(ge=1)
    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    max_new_tokens: int = Field(ge=1)


class ScoreRecord(_Record):
    """One benchmark scored by one engine from one checkpoint (suite.evaluation.Score)."""
    benchmark: str = Field(min_length=1)
    engine: Literal["bf16", "fp32", "rollout"]
    engine_detail: str
    protocol: ProtocolRecord
    step: int = Field(ge=0)
    n_prompts: int = Field(ge=0)
    n_correct: int = Field(ge=0)
    acc: float = Field(ge=0, le=1)
    seconds: float = Field(ge=0)
    grader: str = ""
    metric: str = ""


class EvalResultsFile(_Record):
    """`<run dir>/eval/step_<step>.json`, written by `suite eval`."""
    step: int = Field(ge=0)
    scores: list[ScoreRecord]


# ------------------------------------------------------------------------------ suite bench vllm results

class BenchRow(_Record):
    """One precision `suite bench vllm` measured."""
    rollout: Literal["bf16", "int8", "fp8_per_channel", "w4a16"]
    model: str
    shape: str
    kernels: str
    device: str
    gpu: str
    vllm: str
    prompts: int = Field(ge=1)
    prompt_len: int = Field(ge=1)
    response_len: int = Field(ge=1)
    rollout_tok_s: float = Field(gt=0)
    speedup_vs_bf16: float  # nan where bf16 did not run
    sync_share_pct: float  # nan where no sync was timed

    @field_validator("rollout_tok_s")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v


class BenchErrorRow(_Record):
    """A precision `suite bench vllm` could not measure (the reason)."""
    rollout: str
    error: str


class BenchVllmFile(_Record):
    """`<out>/vllm.json`, written by `suite bench vllm` and read by `suite report --bench`."""
    bench: Literal["vllm"]
    rows: list[Any]

    def measured(self, path: str | os.PathLike) -> list[BenchRow]:
        """The rows that measured something, each checked (an error row is skipped)."""
        out = []
        for i, row in enumerate(self.rows):
            if isinstance(row, dict) and "error" in row:
                validate(BenchErrorRow, row, path, prefix=f"rows.{i}")
                continue
            out.append(validate(BenchRow, row, path, prefix=f"rows.{i}"))
        return out


# ------------------------------------------------------------------------------ a run's records

class RunRecordFile(_Record):
    """`<run dir>/mlflow_run.json`: where the run logs (MlflowLogger)."""
    tracking_uri: str = Field(min_length=1)
    run_id: str | None = None
    experiment: str | None = None
    run_name: str | None = None
    tags: dict[str, Any] | None = None


class SyncMarkerFile(_Record):
    """`<run dir>/mlflow_sync.json`: how far MLflow has the run's metrics (MlflowLogger)."""
    run_id: str | None = None
    synced_step: int = Field(ge=-1)
    end_status: str | None = None


class ParamsFile(RootModel[dict[str, Any]]):
    """`<run dir>/params.json`: the run's MLflow params."""


class TagsFile(RootModel[dict[str, Any]]):
    """`<run dir>/tags.json`: tags set after the run was created."""


class ArtifactsFile(RootModel[list[str]]):
    """`<run dir>/artifacts.json`: the files logged as the run's artifacts."""


class MetricsLine(_Record):
    """One line of `<run dir>/metrics.jsonl` (JsonlLogger)."""
    step: int = Field(ge=0)
    metrics: dict[str, Any]


# ------------------------------------------------------------------------------ a sweep's state

class MatrixCell(_Record):
    """One cell as the launch composed it."""
    index: int = Field(ge=0)
    overrides: list[str]
    axes: dict[str, Any]
    run_id: str = Field(min_length=1)
    run_dir: str = Field(min_length=1)
    steps: int = Field(ge=0)
    config: dict[str, Any] | None = None


class MatrixRecordFile(_Record):
    """`<state dir>/matrix.json`: the last launch's cells, each with its resolved config (Sweep.matrix_json)."""
    tracking_uri: str
    experiment: str
    cells: list[MatrixCell] = Field(min_length=1)
    only: list[str] = []


class CheckpointRecord(_Record):
    """`<run dir>/checkpoints/step_<N>.pt` (torch.save, read weights-only): what the trainer's save_checkpoint
    writes around the state it resumes from (model, optimizer, RNG and loop state)."""
    format: int = Field(ge=1)
    step: int = Field(ge=0)
    state: dict[str, Any]


class JobRecord(_Record):
    """One line of `<state dir>/jobs.jsonl`: a cell's job as the driver (or `suite cancel`) recorded it."""
    cell: int = Field(ge=0)
    run_id: str = Field(min_length=1)
    job_id: str = Field(min_length=1)


class ParentRunFile(_Record):
    """`<state dir>/parent_run.json`: the sweep's MLflow parent run."""
    run_id: str = Field(min_length=1)
    tracking_uri: str = Field(min_length=1)
    experiment: str | None = None


# ------------------------------------------------------------------------------ reading

# file, its schema, the verbs that read it through the schema, the test that feeds them damaged copies
# (a run's config.yaml is read through the run config's own dataclasses, which live with the config, and a
# dataset file through its dataset's declared columns, which live with the converter)
SCHEMAS: tuple[tuple[str, type[BaseModel] | str, str, str], ...] = (
    ("<run dir>/eval/step_<step>.json", EvalResultsFile, "suite eval, suite report",
     "tests/embedded/test_eval.py::TestBadInputs::test_each_refusal"),
    ("<out>/vllm.json", BenchVllmFile, "suite report --bench",
     "tests/report/test_tables.py::test_bench_vllm_rows_join_the_throughput_comparison"),
    ("<state dir>/matrix.json", MatrixRecordFile, "suite status, suite report (a damaged record: the cells are "
     "composed from the file instead)", "tests/test_schemas.py::test_each_schema_refuses_a_damaged_copy"),
    ("<state dir>/jobs.jsonl (each line)", JobRecord, "suite sweep, suite status, suite cancel",
     "tests/sweep/test_status_bad_files.py::test_a_damaged_jobs_file_is_named"),
    ("<state dir>/parent_run.json", ParentRunFile, "suite sweep, suite status, suite report",
     "tests/report/test_report_bad_files.py::test_a_damaged_parent_record_of_a_sweep_is_named"),
    ("<run dir>/config.yaml", "Config (suite.config's dataclasses, through suite.config.load_run_config)",
     "suite eval, suite export",
     "tests/test_verb_refusals.py::TestEval::test_a_run_config_with_a_value_of_the_wrong_type"),
    ("<run dir>/checkpoints/step_<N>.pt", CheckpointRecord, "suite run (resume), suite export, suite eval",
     "tests/test_verb_refusals.py::TestExport::test_a_checkpoint_record_missing_its_state"),
    ("<suite data prepare --src FILE> (.parquet, .jsonl, .json)",
     "Source (suite.verl.data.SOURCES: one per dataset, its published columns)", "suite data prepare",
     "tests/verl/test_data_prepare.py::test_another_schema_is_refused_naming_the_missing_column"),
    ("<run dir>/mlflow_run.json", RunRecordFile, "suite sync",
     "tests/tracking/test_sync_bad_files.py::test_sync_on_damaged_record_files_names_the_file"),
    ("<run dir>/mlflow_sync.json", SyncMarkerFile, "suite sync",
     "tests/tracking/test_sync_bad_files.py::test_sync_on_damaged_record_files_names_the_file"),
    ("<run dir>/params.json", ParamsFile, "suite sync",
     "tests/tracking/test_sync_bad_files.py::test_sync_on_damaged_record_files_names_the_file"),
    ("<run dir>/tags.json", TagsFile, "suite sync", "tests/test_schemas.py::test_each_schema_refuses_a_damaged_copy"),
    ("<run dir>/artifacts.json", ArtifactsFile, "suite sync",
     "tests/tracking/test_sync_bad_files.py::test_sync_on_damaged_record_files_names_the_file"),
    ("<run dir>/metrics.jsonl (each line)", MetricsLine, "suite sync",
     "tests/tracking/test_sync_bad_files.py::test_sync_on_damaged_record_files_names_the_file"),
)


def markdown_table() -> str:
    """SCHEMAS as the table docs/architecture.md shows ("Files and their schemas"; a test keeps it current)."""
    lines = ["| file | schema (suite.schemas) | read through it by | test of a damaged copy |", "|---|---|---|---|"]
    lines += [f"| `{f}` | `{m if isinstance(m, str) else m.__name__}` | {who} | `{test}` |"
              for f, m, who, test in SCHEMAS]
    return "\n".join(lines)


def _expected(err: dict) -> str:
    msg = err["msg"]
    if err["type"] == "missing":
        return "field required"
    if err["type"] == "literal_error":
        return msg.replace("Input should be", "must be")
    return msg.replace("Input should be", "must be").replace("Value error, ", "")


def _where(loc) -> str:
    return ".".join(str(p) for p in loc if p != "root") or "(the whole file)"


def validate(model: type[BaseModel], data: Any, path: str | os.PathLike, prefix: str = ""):
    """`data` (already parsed) as `model`; SchemaError naming `path` and the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = _where(err["loc"])
        where = f"{prefix}.{where}" if prefix and where != "(the whole file)" else (prefix or where)
        got = "" if err["type"] == "missing" else f", got {_short(err.get('input'))}"
        raise SchemaError(f"{path}: {where}: {_expected(err)}{got}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_json(model: type[BaseModel], path: str | os.PathLike):
    """The JSON file at `path` parsed as `model`. FileNotFoundError passes through (the caller decides
    whether an absent file is an error); anything else wrong is one SchemaError line."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SchemaError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return validate(model, data, path)


__all__ = ["SCHEMAS", "ArtifactsFile", "BenchRow", "BenchVllmFile", "EvalResultsFile", "JobRecord", "MatrixCell",
           "MatrixRecordFile", "MetricsLine", "ParamsFile", "ParentRunFile",
           "ProtocolRecord", "RunRecordFile", "SchemaError", "ScoreRecord", "SyncMarkerFile", "TagsFile", "read_json",
           "validate"]
