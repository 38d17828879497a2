"""`suite export`: the warm-started embedded model as a Hugging Face Llama whose logits equal the
embedded model's, a tokenizer and chat template that give the embedded token ids, and the task's
train pool / held-out set as verl parquet scored by the task's own verify."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

OVERRIDES = ["task.difficulty=1", "task.n_eval=8", "warm_start.steps=20", "warm_start.batch_size=8", "threads=1"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from suite.config import compose_config
    from suite.embedded.export import export

    root = tmp_path_factory.mktemp("export")
    cfg = compose_config([*OVERRIDES, f"warm_start.cache_dir={root / 'warm'}"])
    paths = export(cfg, root / "out", progress=False)
    return cfg, paths, root


def test_the_exported_model_computes_the_embedded_logits(exported):
    from transformers import LlamaForCausalLM

    from suite.embedded.model import PRESETS, ModelConfig, Transformer
    from suite.embedded.tokenizer import CharTokenizer

    cfg, paths, root = exported
    meta = json.loads((root / "out" / "export.json").read_text())
    state = torch.load(meta["warm_start"], map_location="cpu", weights_only=True)["state_dict"]
    tok = CharTokenizer()
    emb = Transformer(ModelConfig(**{**PRESETS[cfg.model.preset], "vocab_size": tok.vocab_size}))
    emb.load_state_dict(state)
    hf = LlamaForCausalLM.from_pretrained(paths["model"], torch_dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, tok.vocab_size, (3, 40), generator=g)
    with torch.no_grad():
        want = emb.eval()(ids).float()
        got = hf(input_ids=ids).logits.float()
    assert got.shape == want.shape
    # the same network in float32, two implementations: rounding only (measured max ~1e-5 of logits ~10)
    assert (got - want).abs().max().item() < 1e-4 * want.abs().max().item()
    assert not torch.equal(want[0], want[1])  # different inputs, different logits: the comparison can fail


def test_the_chat_template_gives_the_embedded_token_ids(exported):
    """verl renders a prompt with the chat template and tokenizes it without special tokens; the
    result must be the embedded prompt ids (no <bos>), and <eos> must be the embedded eos id."""
    from transformers import AutoTokenizer

    from suite.embedded.tasks import make_split, make_task
    from suite.embedded.tokenizer import CharTokenizer

    _, paths, _ = exported
    hf = AutoTokenizer.from_pretrained(paths["model"])
    tok = CharTokenizer()
    for ex in make_split(make_task("arith", 1), 5, seed=3, split="eval"):
        text = hf.apply_chat_template([{"role": "user", "content": ex.prompt}], add_generation_prompt=True,
                                      tokenize=False)
        assert text == ex.prompt
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(ex.prompt)
        assert hf.decode(tok.encode(ex.response) + [tok.eos_id], skip_special_tokens=True) == ex.response
    text = "Ann has 3 apples; (12 - 5) / 7 = 1, #1?"  # the word problems' spaces and punctuation
    assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
    assert hf.decode(tok.encode(text)) == text  # verl scores the decoded response text
    assert (hf.eos_token_id, hf.pad_token_id) == (tok.eos_id, tok.pad_id)


def test_the_data_are_the_runs_prompts_and_the_reward_is_the_tasks_verify(exported):
    import pandas as pd

    from suite.embedded.config import TRAIN_POOL
    from suite.embedded.tasks import make_split, make_task
    from suite.embedded.trainer import EVAL_SEED

    cfg, paths, _ = exported
    task = make_task("arith", 1)
    test = pd.read_parquet(paths["test"])
    held_out = make_split(task, cfg.task.n_eval, EVAL_SEED, "eval")
    assert [p[0]["content"] for p in test["prompt"]] == [e.prompt for e in held_out]
    assert list(test["reward_model"].map(lambda r: r["ground_truth"])) == [e.answer for e in held_out]
    assert set(test["data_source"]) == {"arith"}  # held-out accuracy lands as val-core/arith/...
    train = pd.read_parquet(paths["train"])
    assert len(train) == TRAIN_POOL and train["prompt"][0][0]["content"] == make_split(task, 1, cfg.seed,
                                                                                        "train")[0].prompt
    spec = importlib.util.spec_from_file_location("exported_reward", paths["reward"])
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)
    for ex in held_out:
        extra = {"difficulty": 1}
        assert reward.compute_score("arith", ex.response, ex.answer, extra) == 1.0
        assert reward.compute_score("arith", ex.response, str(int(ex.answer) + 1), extra) == 0.0


@pytest.mark.slow
def test_export_refuses_a_used_directory_and_another_backend(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    cli = "import sys; from suite.cli import main; sys.argv[0] = 'suite'; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", cli, "export", "--out", str(tmp_path / "out"), *OVERRIDES,
                           f"warm_start.cache_dir={tmp_path / 'warm'}"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})
    assert proc.returncode == 2 and "exists and is not empty" in proc.stderr, proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]
    assert not (tmp_path / "warm").exists()  # refused before any training
    proc = subprocess.run([sys.executable, "-c", cli, "export", "--out", str(tmp_path / "o2"), "backend=verl",
                           "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "embedded backend" in proc.stderr and not (tmp_path / "o2").exists()


@pytest.mark.slow
def test_export_of_a_run_writes_its_trained_actor_and_refuses_a_run_without_a_checkpoint(tmp_path):
    """`suite export --run RUN_DIR`: the actor at the run's newest checkpoint (here after 2 RL
    steps, so it differs from the warm start), the run's own prompts; a run dir without a
    checkpoint, or overrides beside --run, exit 2 and write nothing."""
    from safetensors.torch import load_file

    from suite.config import compose_config
    from suite.embedded.trainer import EmbeddedRun
    from suite.tracking.checkpoint import load_latest_checkpoint

    cfg = compose_config([*OVERRIDES, f"warm_start.cache_dir={tmp_path / 'warm'}", "steps=2", "ckpt_every=1",
                          "rollout.prompts_per_step=2", "algo.group_size=2", "train.lr=1e-3"])
    run_dir = tmp_path / "run"
    EmbeddedRun(cfg, str(run_dir), progress=False).run()
    step, state = load_latest_checkpoint(run_dir)
    assert step == 2
    cli = "import sys; from suite.cli import main; sys.argv[0] = 'suite'; sys.exit(main())"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"}
    proc = subprocess.run([sys.executable, "-c", cli, "export", "--run", str(run_dir), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    info = json.loads((tmp_path / "out" / "export.json").read_text())
    assert (info["run_dir"], info["step"]) == (str(run_dir), 2)
    hf = load_file(tmp_path / "out" / "model" / "model.safetensors")
    trained = state["actor"]["layers.0.attn.wq.weight"]
    assert torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], trained)
    [cached] = (tmp_path / "warm").rglob("*.pt")
    warm = torch.load(cached, weights_only=True)["state_dict"]
    assert not torch.equal(trained, warm["layers.0.attn.wq.weight"])  # trained: not the warm start
    import pandas as pd

    test = pd.read_parquet(tmp_path / "out" / "test.parquet")
    assert len(test) == cfg.task.n_eval

    empty = tmp_path / "empty_run"
    empty.mkdir()
    (empty / "config.yaml").write_text((run_dir / "config.yaml").read_text())
    for args, says in ((["--run", str(empty)], "holds no checkpoint"),
                       (["--run", str(tmp_path / "nowhere")], "no config.yaml"),
                       (["--run", str(run_dir), "seed=1"], "drop the overrides")):
        proc = subprocess.run([sys.executable, "-c", cli, "export", *args, "--out", str(tmp_path / "o2")],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 2 and says in proc.stderr, (args, proc.stderr)
        assert not (tmp_path / "o2").exists()
    _damaged_checkpoints(tmp_path, run_dir)


def _damaged_checkpoints(tmp_path, run_dir):
    """Export reads a run and never changes it: a truncated newest checkpoint is named (not
    passed over for an older one, not moved aside), `--step` picks an older one; a verl run, a
    file as --out, a step that is not there: one line each, exit 2, nothing written."""
    import contextlib
    import io

    from suite.cli import main

    def export(*argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["export", *argv])
        return code, err.getvalue()

    ckpts = run_dir / "checkpoints"
    newest = ckpts / "step_00000002.pt"
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])
    listing = sorted(p.name for p in ckpts.iterdir())
    code, err = export("--run", str(run_dir), "--out", str(tmp_path / "o3"))
    assert code == 2 and f"checkpoint {newest} (step 2) cannot be read" in err and "--step 1" in err, err
    assert sorted(p.name for p in ckpts.iterdir()) == listing and not (tmp_path / "o3").exists()
    code, err = export("--run", str(run_dir), "--step", "1", "--out", str(tmp_path / "o3"))
    assert code == 0, err
    assert json.loads((tmp_path / "o3" / "export.json").read_text())["step"] == 1
    (ckpts / "step_00000001.pt").write_bytes(b"not a checkpoint")
    code, err = export("--run", str(run_dir), "--out", str(tmp_path / "o4"))
    assert code == 2 and "(step 2) cannot be read" in err and "no older checkpoint can be read" in err, err
    code, err = export("--run", str(run_dir), "--step", "7", "--out", str(tmp_path / "o4"))
    assert code == 2 and "--step 7" in err and "it has steps 1, 2" in err, err
    (tmp_path / "afile").write_text("x")
    newest.write_bytes(data)
    code, err = export("--run", str(run_dir), "--out", str(tmp_path / "afile"))
    assert code == 2 and "exists and is not a directory" in err, err
    verl = tmp_path / "verl_run"
    verl.mkdir()
    (verl / "config.yaml").write_text("backend: {name: verl}\n")
    code, err = export("--run", str(verl), "--out", str(tmp_path / "o4"))
    assert code == 2 and "a verl run" in err and "drop backend" not in err, err
    code, err = export("--step", "1", "--out", str(tmp_path / "o4"))
    assert code == 2 and "--step" in err, err
    assert not (tmp_path / "o4").exists() and sorted(p.name for p in ckpts.iterdir()) == listing


def test_export_refuses_a_head_size_vllms_cpu_build_cannot_serve(tmp_path, monkeypatch):
    """Every preset has head size 64; a preset of d_model 96 over 2 heads (48, not among vLLM CPU's
    sizes) is refused before any training or writing."""
    from suite.config import compose_config
    from suite.embedded import model
    from suite.embedded.export import export

    monkeypatch.setitem(model.PRESETS, "tiny", {**model.PRESETS["tiny"], "d_model": 96, "n_heads": 2, "d_ff": 256})
    cfg = compose_config([*OVERRIDES, f"warm_start.cache_dir={tmp_path / 'warm'}"])
    with pytest.raises(ValueError, match=r"head size d_model / n_heads = 96 / 2 = 48.*serves 32, 64, 80"):
        export(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "warm").exists()
