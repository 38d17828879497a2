"""`suite eval` of an embedded run: its checkpoint's actor scored on its task's held-out sets.

The benchmarks stand in for the papers' on CPU: the run's task at each difficulty level whose
prompts and responses fit the model (``arith-d1`` .. ``arith-d4``), each the level's held-out prompts
(the trainer's evaluation set: ``task.n_eval`` of them, the same seed, or all a level holds out when it
has fewer: arith-d1 holds out 75), graded by the task's
exact-answer ``verify``. The run's own level is the set its in-training validation scored: the
``fp32`` engine at the last checkpoint reproduces that accuracy exactly.

Engines (suite.evaluation): ``fp32`` (the trainer's precision, what validation scores), ``bf16``
(the suite's bf16 engine on the same weights) and ``rollout`` (the run's quantized rollout copy:
its precision, kernels, lm_head and outlier transform, as built for training).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from omegaconf import DictConfig

from suite.evaluation import EvalError, Protocol, Score

ENGINES = ("bf16", "fp32", "rollout")


def benchmarks(cfg: DictConfig) -> dict[str, tuple[int, int]]:
    """name -> (difficulty, response budget in tokens) of every level of the run's task that fits its
    model: the run's own level with the run's budget, the others with what their traces need."""
    from suite.embedded.model import PRESETS
    from suite.embedded.tasks import LEVELS, make_task

    max_len = PRESETS[cfg.model.preset]["max_seq_len"]
    out = {}
    for d in sorted(LEVELS[cfg.task.name]):
        task = make_task(cfg.task.name, d)
        budget = int(cfg.rollout.max_new_tokens) if d == cfg.task.difficulty else task.max_response_tokens
        if task.max_prompt_chars + budget <= max_len:
            out[f"{cfg.task.name}-d{d}"] = (d, budget)
    return out


def benchmark_names(cfg: DictConfig) -> list[str]:
    return list(benchmarks(cfg))


def checkpoint_steps(run_dir: str | os.PathLike) -> list[int]:
    from suite.tracking.rundir import list_checkpoints

    return [step for step, _ in list_checkpoints(run_dir)]


def selection_benchmarks(cfg: DictConfig) -> list[str]:
    """The benchmarks whose in-training validation `--checkpoint best` can choose on: the run's own level."""
    return [f"{cfg.task.name}-d{cfg.task.difficulty}"]


def best_step(cfg: DictConfig, run_dir: str | os.PathLike, steps: list[int], select_on: list[str]) -> int:
    """The checkpoint whose step has the best logged held-out accuracy (greedy mean@1) on the run's own
    level, the only one an embedded run validates on (``select_on`` is that level)."""
    from suite.tracking.jsonl import read_jsonl
    from suite.tracking.rundir import METRICS_FILE

    key = f"val-core/{cfg.task.name}/acc/mean@1"
    acc = {}
    path = Path(run_dir) / METRICS_FILE
    if path.is_file():
        try:
            for entry in read_jsonl(path):
                if key in entry.get("metrics", {}):
                    acc[int(entry["step"])] = float(entry["metrics"][key])
        except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, KeyError) as exc:
            raise EvalError(f"--checkpoint best: {path}: not a readable metrics file ({type(exc).__name__}); give a "
                            f"step ({', '.join(map(str, steps))}) or 'last'") from None
    scored = [s for s in steps if s in acc]
    if not scored:
        raise EvalError(f"--checkpoint best: no checkpoint of {run_dir} is at an evaluated step (checkpoints: "
                        f"{', '.join(map(str, steps))}; evaluated: {', '.join(map(str, sorted(acc))) or 'none'}); "
                        f"give a step or 'last'")
    return max(scored, key=lambda s: (acc[s], s))


def load_actor(cfg: DictConfig, run_dir: str | os.PathLike, step: int):
    """The actor of checkpoint ``step`` (read only; a damaged file is an EvalError naming it)."""
    import torch

    from suite.embedded.model import PRESETS, ModelConfig, Transformer
    from suite.embedded.tokenizer import CharTokenizer
    from suite.tracking.rundir import checkpoint_path

    path = checkpoint_path(run_dir, step)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        state = payload["state"]["actor"]
    except Exception as exc:  # noqa: BLE001 - any failure to read is a damaged or foreign file
        raise EvalError(f"{path}: not a readable suite checkpoint ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None
    preset = dict(PRESETS[cfg.model.preset], vocab_size=CharTokenizer().vocab_size)
    actor = Transformer(ModelConfig(**preset))
    try:
        actor.load_state_dict(state)
    except RuntimeError as exc:
        first = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line or "key" in line), "")
        raise EvalError(f"{path}: holds another model than the run's config (model.preset={cfg.model.preset}): "
                        f"{first[:200]}") from None
    actor.requires_grad_(False)
    return actor


def check_checkpoint(cfg: DictConfig, run_dir: str | os.PathLike, step: int) -> None:
    """Refuse (EvalError) a checkpoint that cannot be read or holds another model."""
    load_actor(cfg, run_dir, step)


def _engine(run, actor, engine: str):
    """The engine ``engine`` of the run: fp32, bf16 or its rollout copy."""
    from suite import hardware
    from suite.core.quant import QuantScheme
    from suite.embedded import parts
    from suite.embedded.engine import RolloutEngine

    if engine == "fp32":
        return RolloutEngine(actor, QuantScheme(precision="fp32")), "embedded fp32"
    if engine == "bf16":
        k = hardware.resolve_bf16_kernels(run.bf16_kernels, "bf16")
        return RolloutEngine(actor, QuantScheme(precision="bf16"), kernels=k, bf16_kernels=k), f"embedded bf16 {k}"
    rollout, _ = parts.engines(actor, run.scheme, kernels=run.kernels_executed, bf16_kernels=run.bf16_kernels,
                               lm_head=run.quant_lm_head, outlier_alpha=run.outlier_alpha,
                               outlier_channels=run.outlier_channels)
    return rollout, f"embedded {run.scheme.precision} {run.kernels_executed} (the run's rollout copy)"


def protocols(cfg: DictConfig, budget: int) -> list[tuple[Protocol, int]]:
    """(protocol, draw seed) of a benchmark: greedy pass@1 at the run's evaluation temperature, and
    Avg@k at the rollout's temperature and top_p when the run validates with ``task.eval_samples = k``
    (the trainer's seeds, so the run's own level reproduces its validation)."""
    from suite.embedded.trainer import EVAL_SEED

    out = [(Protocol(1, float(cfg.rollout.eval_temperature), 1.0, budget), EVAL_SEED)]
    if cfg.task.eval_samples:
        out.append((Protocol(int(cfg.task.eval_samples), float(cfg.rollout.temperature), float(cfg.rollout.top_p),
                             budget), EVAL_SEED + 1))
    return out


def evaluate(cfg: DictConfig, run_dir: str, *, step: int, engines: list[str], names: list[str],
             done: list[Score], log=print) -> list[Score]:
    """Score checkpoint ``step`` on benchmarks ``names`` with ``engines``; the jobs already in
    ``done`` are not run again."""
    from suite.embedded.tasks import make_split, make_task
    from suite.embedded.trainer import EVAL_SEED, EmbeddedRun, count_correct

    from importlib import metadata

    run = EmbeddedRun(cfg, run_dir, progress=False)  # the run's settings; nothing is trained or written
    # the task's own exact-answer check (suite.embedded.tasks), recorded beside every score as verl's graders are
    grader = f"suite-{cfg.task.name}-verify (suite {metadata.version('suite')})"
    actor = load_actor(cfg, run_dir, step)
    table = benchmarks(cfg)
    scores = []
    for engine in engines:
        eng, detail = _engine(run, actor, engine)
        eng.sync(actor)
        for name in names:
            difficulty, budget = table[name]
            task = make_task(cfg.task.name, difficulty)
            # the trainer's held-out prompts; a level with fewer than task.n_eval (arith-d1 holds out 75) all it has
            prompts = make_split(task, cfg.task.n_eval, EVAL_SEED, "eval", allow_fewer=True)
            for protocol, seed in protocols(cfg, budget):
                probe = Score(name, engine, detail, protocol, step, len(prompts), 0, 0.0, 0.0)
                if any(probe.same_job(d) for d in done):
                    continue
                t0 = time.perf_counter()
                correct = count_correct(eng, task, run.tokenizer, prompts, samples=protocol.samples,
                                        max_new_tokens=protocol.max_new_tokens, temperature=protocol.temperature,
                                        top_p=protocol.top_p, seed=seed)
                acc = correct / (len(prompts) * protocol.samples)
                scores.append(Score(name, engine, detail, protocol, step, len(prompts), correct, acc,
                                    time.perf_counter() - t0, grader))
                log(f"suite eval: {name} {engine} {protocol.metric}: {acc:.4f} ({correct}/"
                    f"{len(prompts) * protocol.samples}, {detail})")
    return scores


__all__ = ["ENGINES", "benchmark_names", "benchmarks", "best_step", "check_checkpoint", "checkpoint_steps", "evaluate",
           "load_actor", "protocols", "selection_benchmarks"]
