"""`suite eval` of a verl run: the trained policy, not its quantized rollout copy, scored per benchmark.

verl's in-training validation generates with the rollout engine (the INT8 / FP8 / W4A16 copy), so
its accuracy mixes that engine's error with what training achieved (FlashRL's README says the same of
its validation, and re-evaluates merged checkpoints in BF16). Here the run's FSDP checkpoint
(``checkpoints/global_step_N/actor``) is merged by verl's own model merger into a Hugging Face model
and served by vLLM:

- ``bf16``: the merged model in bf16;
- ``rollout``: the run's rollout engine on the same weights: the W8A8 INT8 / per-channel FP8 / packed
  int4 W4A16 checkpoint the weight sync reproduces (suite.verl.w8a8_checkpoint;
  tests/vllm_cpu/test_weight_sync.py shows a synced engine computes what a fresh load of it computes),
  vLLM's own FP8 on the merged model for block FP8, the W4A16-rounded weights on bf16 kernels for
  ``quant.w4a16_kernels=emulated``, bf16 for bf16.

Benchmarks are the data sources of the run's held-out files (``backend.val_files``), each prompt asked
as verl asks it (the tokenizer's chat template with the generation prompt), sampled by the run's
validation protocol (``backend.val_n`` samples at ``rollout.eval_temperature`` / ``backend.val_top_p``:
a recipe's greedy pass@1 or Avg@32) and graded by the run's scorer (``reward_fn_file``: its reward
file, else suite.verl.reward). The merged model lives in ``RUN_DIR/eval/merged`` while it is scored and
is removed after (a 7B model is ~15 GB); a later call merges again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from suite.evaluation import EVAL_DIR, EvalError, Protocol, Score

ENGINES = ("bf16", "rollout")
STEP_DIR = re.compile(r"^global_step_(\d+)$")
# what must agree between the checkpoint's model and the run's (config.json keys)
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size")
MERGE_TIMEOUT_S = 3600


def _val_files(cfg: DictConfig) -> list[Path]:
    files = [Path(p.strip()) for p in str(cfg.backend.val_files).split(",") if p.strip()]
    missing = [p for p in files if not p.is_file()]
    if not files or missing:
        raise EvalError(f"backend.val_files: {missing[0] if missing else '(empty)'}: no such data file (the run's "
                        f"held-out set; `suite data prepare NAME --src FILE --out DIR` writes one)")
    return files


def _rows(cfg: DictConfig) -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for path in _val_files(cfg):
        try:
            rows += pq.read_table(path).to_pylist()
        except Exception as exc:  # noqa: BLE001 - any unreadable file is named
            raise EvalError(f"backend.val_files: {path}: not a readable parquet file ({type(exc).__name__})") from None
    return rows


def benchmark_names(cfg: DictConfig) -> list[str]:
    """The data sources of the run's held-out files, in file order; each must have a grader (suite.scoring)
    unless the run grades with its own reward file."""
    from suite.scoring import UnknownSource, grader_for

    rows = _rows(cfg)
    bad = next((i for i, r in enumerate(rows) if not (isinstance(r.get("data_source"), str) and r["data_source"])),
               None)
    if bad is not None:
        raise EvalError(f"backend.val_files: row {bad} has no data_source (each row names the benchmark it belongs "
                        f"to; `suite data prepare` writes it)")
    names = list(dict.fromkeys(str(r["data_source"]) for r in rows))
    if not cfg.backend.reward_fn_path:
        for name in names:
            try:
                grader_for(name)
            except UnknownSource as exc:
                raise EvalError(f"backend.val_files: {exc} (or set backend.reward_fn_path to a reward file)") from None
    return names


def _actor_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"global_step_{step}" / "actor"


def checkpoint_steps(run_dir: str | os.PathLike) -> list[int]:
    d = Path(run_dir) / "checkpoints"
    if not d.is_dir():
        return []
    return sorted(int(m.group(1)) for p in d.iterdir() if (m := STEP_DIR.match(p.name)) and (p / "actor").is_dir())


def selection_benchmarks(cfg: DictConfig) -> list[str]:
    """The benchmarks whose in-training validation `--checkpoint best` can choose on: every held-out set."""
    return benchmark_names(cfg)


def best_step(cfg: DictConfig, run_dir: str | os.PathLike, steps: list[int], select_on: list[str]) -> int:
    """The checkpoint at the step of the best logged validation on the data sources ``select_on`` (their
    mean; the run's MLflow history)."""
    from mlflow.tracking import MlflowClient

    from suite.tracking.outage import LIVE_HTTP_ENV, http_env
    from suite.tracking.rundir import RUN_FILE
    from suite.tracking.values import held_out_keys

    try:
        record = json.loads((Path(run_dir) / RUN_FILE).read_text())
        with http_env(LIVE_HTTP_ENV):
            client = MlflowClient(record["tracking_uri"])
            _, keys = held_out_keys(client.get_run(record["run_id"]).data.metrics)
            keys = [k for k in keys if any(k.startswith(f"val-core/{name}/") for name in select_on)]
            acc: dict[int, list[float]] = {}
            for key in keys:
                for m in client.get_metric_history(record["run_id"], key):
                    acc.setdefault(m.step, []).append(m.value)
    except Exception as exc:  # noqa: BLE001 - without the history there is no "best"
        raise EvalError(f"--checkpoint best: the run's validation history is not readable ({type(exc).__name__}); "
                        f"give a step ({', '.join(map(str, steps))}) or 'last'") from None
    scored = [s for s in steps if s in acc]
    if not scored:
        raise EvalError(f"--checkpoint best: no checkpoint of {run_dir} is at a validated step; give a step "
                        f"({', '.join(map(str, steps))}) or 'last'")
    return max(scored, key=lambda s: (sum(acc[s]) / len(acc[s]), s))


def _shape(config_path: Path) -> dict:
    cfg = json.loads(config_path.read_text())
    return {k: cfg.get(k) for k in SHAPE_KEYS}


def check_checkpoint(cfg: DictConfig, run_dir: str | os.PathLike, step: int) -> None:
    """Refuse a checkpoint verl's merger cannot read, or one of another model than the run's."""
    actor = _actor_dir(run_dir, step)
    hf = actor / "huggingface" / "config.json"
    if not (actor / "fsdp_config.json").is_file() or not hf.is_file():
        raise EvalError(f"{actor}: not a complete verl FSDP checkpoint (fsdp_config.json and huggingface/config.json "
                        f"expected)")
    base = Path(str(cfg.backend.model_path)) / "config.json"
    if base.is_file():
        got, want = _shape(hf), _shape(base)
        differ = [k for k in SHAPE_KEYS if got[k] != want[k]]
        if differ:
            k = differ[0]
            raise EvalError(f"{actor}: holds another model than the run's backend.model_path={cfg.backend.model_path} "
                            f"({k} {got[k]} there, {want[k]} in the run's)")


def merge(run_dir: str | os.PathLike, step: int, python: str = sys.executable, log=print) -> Path:
    """verl's model merger: the FSDP actor of checkpoint ``step`` as a Hugging Face model in
    RUN_DIR/eval/merged (replaced if a partial one is there)."""
    out = Path(run_dir) / EVAL_DIR / "merged"
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir",
                           str(_actor_dir(run_dir, step)), "--target_dir", str(out)],
                          capture_output=True, text=True, timeout=MERGE_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"verl's model merger failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    log(f"suite eval: merged {_actor_dir(run_dir, step)} -> {out} ({time.perf_counter() - t0:.0f} s)")
    return out


def rollout_model(cfg: DictConfig, merged: Path, out: Path) -> tuple[Path, dict, str]:
    """(model dir, extra vLLM arguments, description) of the run's rollout engine on ``merged``."""
    from suite.verl.rollout_quant import quant_rollout

    q = cfg.quant
    name, rollout = quant_rollout(q)
    if rollout.weight_sync == "requantize":
        from suite.verl.w8a8_checkpoint import write_w8a8_checkpoint

        return (write_w8a8_checkpoint(merged, out, name, q.group_size, q.symmetric), {},
                f"vLLM {rollout.vllm_scheme} ({name})")
    if rollout.weight_sync == "fake_quant":
        return fake_quant_checkpoint(cfg, merged, out), {}, f"vLLM bf16 kernels on {q.precision}-rounded weights " \
            f"({rollout.kernels_note})"
    if q.precision == "fp8":  # block FP8: vLLM quantizes the bf16 checkpoint itself, as verl's native FP8
        return merged, {"quantization": "fp8"}, "vLLM fp8 (block, online)"
    return merged, {}, "vLLM bf16 (the run's rollout precision)"


def fake_quant_checkpoint(cfg: DictConfig, merged: Path, out: Path) -> Path:
    """``merged`` with every block linear's weight put on the run's W4A16 grid (what verl's W4A16 rollout
    computes after a sync: suite.verl.int8_hook ``fake_quant_weights``), the rest copied."""
    from safetensors.torch import load_file, save_file

    from suite.verl.int8_hook import fake_quant_weights
    from suite.verl.rollout_quant import rollout_scheme

    q = cfg.quant
    scheme = rollout_scheme(q.precision, group_size=q.group_size, symmetric=q.symmetric,
                            fp8_granularity=q.fp8_granularity)
    out.mkdir(parents=True, exist_ok=True)
    for p in merged.iterdir():
        if p.suffix == ".safetensors":
            tensors = load_file(p)
            save_file({k: v.contiguous() for k, v in fake_quant_weights(tensors.items(), scheme)}, out / p.name,
                      metadata={"format": "pt"})
        elif p.is_file():
            shutil.copy2(p, out / p.name)
    return out


def _scorer(cfg: DictConfig):
    """(the run's reward file's ``compute_score``, or None for the suite's graders, and a label of the grader)."""
    from suite.verl.translate import reward_fn_file

    if not cfg.backend.reward_fn_path:
        return None, ""
    path = reward_fn_file(cfg)
    spec = importlib.util.spec_from_file_location("suite_eval_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score, f"reward file {path}"


def _grade(compute_score, items: list[tuple[str, str, str, dict | None]]) -> list:
    """Each (data_source, response, truth, extra_info) graded: by the suite's graders in parallel over the
    cores (suite.scoring), or by the run's own reward file."""
    if compute_score is None:
        from suite.scoring import grade_many

        return grade_many([(ds, text, truth) for ds, text, truth, _ in items])
    return [compute_score(ds, text, truth, extra) for ds, text, truth, extra in items]


def protocol(cfg: DictConfig) -> Protocol:
    """The run's eval protocol: ``backend.val_n`` samples at its evaluation temperature / top_p, each at most
    ``backend.val_max_new_tokens`` long (the paper's eval script's budget; 0: the training budget)."""
    from omegaconf import OmegaConf

    t = float(cfg.rollout.eval_temperature)
    # a run composed before the key existed has none: it scored at the training budget
    budget = int(OmegaConf.select(cfg, "backend.val_max_new_tokens", default=0) or cfg.rollout.max_new_tokens)
    return Protocol(int(cfg.backend.val_n), t, float(cfg.backend.val_top_p) if t > 0 else 1.0, budget)


def _llm(cfg: DictConfig, model: Path, extra: dict, max_new_tokens: int):
    from vllm import LLM

    from suite.verl.rollout_quant import WORKER_EXTENSION

    b = cfg.backend
    kw = dict(model=str(model), dtype="bfloat16", seed=int(cfg.seed),
              max_model_len=int(b.max_prompt_length) + max_new_tokens,
              # the suite's extension: on an AMX CPU it asks for the tile permission vLLM's INT8 GEMM needs
              worker_extension_cls=WORKER_EXTENSION, **extra)
    if b.device == "cpu":
        kw.update(enforce_eager=True)
    else:
        kw.update(tensor_parallel_size=int(b.tensor_parallel_size),
                  gpu_memory_utilization=float(b.gpu_memory_utilization))
    return LLM(**kw)


def _prompts(rows: list[dict], model: Path) -> list[str]:
    """Each row's chat messages as verl's dataset renders them: the chat template, generation prompt on."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model))
    return [tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False) for r in rows]


def evaluate(cfg: DictConfig, run_dir: str, *, step: int, engines: list[str], names: list[str],
             done: list[Score], log=print, model_dir: Path | None = None) -> list[Score]:
    """Score checkpoint ``step`` on data sources ``names`` with ``engines``; jobs in ``done`` are skipped.
    ``model_dir``: a Hugging Face model to serve as it is (`suite eval --model`: a base model, step 0)
    instead of the run's merged checkpoint."""
    from vllm import SamplingParams

    from suite.verl.reward import correct

    proto = protocol(cfg)
    rows = [r for r in _rows(cfg) if str(r["data_source"]) in names]

    def wanted(name: str, engine: str) -> bool:
        return not any(Score(name, engine, "", proto, step, 0, 0, 0.0, 0.0).same_job(d) for d in done)

    todo = [e for e in engines if any(wanted(n, e) for n in names)]
    if not todo:
        return []
    if cfg.backend.device == "cpu":
        from suite.verl.cpu_workarounds import VERL_CPU_DRIVER_ENV

        for k, v in VERL_CPU_DRIVER_ENV.items():
            os.environ.setdefault(k, v)
    compute_score, custom = _scorer(cfg)
    if compute_score is None:
        from suite.scoring import grader_for

        graders = {name: grader_for(name).label() for name in names}
    merged = model_dir if model_dir is not None else merge(run_dir, step, log=log)
    scores = []
    try:
        prompts = _prompts(rows, merged)
        for engine in todo:
            if engine == "bf16":
                model, extra = merged, {}
                detail = "vLLM bf16 (" + ("the model as given" if model_dir is not None else "merged checkpoint") + ")"
            else:
                model, extra, detail = rollout_model(cfg, merged, Path(run_dir) / EVAL_DIR / "merged-rollout")
            llm = _llm(cfg, model, extra, proto.max_new_tokens)
            params = SamplingParams(n=proto.samples, temperature=proto.temperature, top_p=proto.top_p,
                                    max_tokens=proto.max_new_tokens, seed=int(cfg.seed))
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            for name in [n for n in names if wanted(n, engine)]:
                idx = [i for i, r in enumerate(rows) if str(r["data_source"]) == name]
                items = [(name, o.text, str(rows[i]["reward_model"]["ground_truth"]), rows[i].get("extra_info"))
                         for i in idx for o in outs[i].outputs]
                right = [correct(r) for r in _grade(compute_score, items)]
                per_prompt = [right[j * proto.samples:(j + 1) * proto.samples] for j in range(len(idx))]  # [P][k]
                seconds_here = seconds * len(idx) / max(1, len(rows))
                for metric, n_correct, n in sample_metrics(per_prompt, proto.samples):
                    scores.append(Score(name, engine, detail, proto, step, len(idx), n_correct, n_correct / n,
                                        seconds_here, custom or graders[name], metric))
                    log(f"suite eval: {name} {engine} {metric or proto.metric}: {n_correct / n:.4f} ({n_correct}/{n}, "
                        f"{detail})")
            del llm
            _free_engine()
    finally:
        for d in ([] if model_dir is not None else [merged]) + [Path(run_dir) / EVAL_DIR / "merged-rollout"]:
            shutil.rmtree(d, ignore_errors=True)
    return scores


def sample_metrics(per_prompt: list[list[bool]], k: int) -> list[tuple[str, int, int]]:
    """(metric, right, out of) from one set of k samples per prompt: mean@k over all of them (metric ""),
    and for k > 1 also mean@1 (each prompt's first sample: Avg@1 at the same temperature, so a paper's
    Avg@1 row pairs where Avg@k is scored) and pass@k (any of the k right), keyed apart."""
    out = [("", sum(map(sum, per_prompt)), len(per_prompt) * k)]
    if k > 1:
        out += [("mean@1", sum(p[0] for p in per_prompt), len(per_prompt)),
                (f"pass@{k}", sum(any(p) for p in per_prompt), len(per_prompt))]
    return out


def _free_engine() -> None:
    import gc

    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - freeing memory is best effort
        pass


__all__ = ["ENGINES", "benchmark_names", "best_step", "check_checkpoint", "checkpoint_steps", "evaluate",
           "sample_metrics", "selection_benchmarks",
           "fake_quant_checkpoint", "merge", "protocol", "rollout_model"]
