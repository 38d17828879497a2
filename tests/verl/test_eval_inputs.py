"""`suite eval` of a verl run refuses bad input before anything is merged, served or written: an
unknown benchmark (the run's held-out data sources are listed), an engine verl runs have not, a missing
held-out file, a run without a checkpoint, a checkpoint of another model than the run's. The run
directory is a real verl run's layout (config.yaml, checkpoints/global_step_N/actor with verl's
fsdp_config.json and huggingface/config.json); merging and serving need vLLM (tests/vllm_cpu/test_eval.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

pytestmark = pytest.mark.verl


def _suite(*args):
    code = "import sys; from suite.cli import main; sys.argv[0] = 'suite'; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def verl_run(tiny_qwen2, tmp_path):
    import pandas as pd

    from suite.config import compose_config

    val = tmp_path / "val.parquet"
    pd.DataFrame([{"data_source": ds, "prompt": [{"role": "user", "content": "1+1="}],
                   "reward_model": {"style": "rule", "ground_truth": "2"}} for ds in ("aime2024", "olympiadbench")]
                 ).to_parquet(val)
    cfg = compose_config(["backend=verl", f"backend.model_path={tiny_qwen2}", f"backend.train_files={val}",
                          f"backend.val_files={val}", "quant=int8", "uaq.s=1.0"])
    run = tmp_path / "run"
    actor = run / "checkpoints" / "global_step_2" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    shutil.copy(tiny_qwen2 / "config.json", actor / "huggingface" / "config.json")
    (run / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return run


def _refused(proc, *words):
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


def test_each_bad_input_is_refused_and_nothing_is_written(verl_run, tmp_path):
    _refused(_suite("eval", verl_run, "--benchmarks", "gsm8k"), "'gsm8k'", "aime2024, olympiadbench")
    _refused(_suite("eval", verl_run, "--precision", "fp32"), "'fp32'", "bf16, rollout")
    _refused(_suite("eval", verl_run, "--checkpoint", "7"), "'7'", "last, best, 2")
    hf = verl_run / "checkpoints" / "global_step_2" / "actor" / "huggingface" / "config.json"
    other = json.loads(hf.read_text())
    hf.write_text(json.dumps({**other, "hidden_size": other["hidden_size"] * 2}))
    _refused(_suite("eval", verl_run), "holds another model", f"hidden_size {other['hidden_size'] * 2} there")
    hf.write_text(json.dumps(other))
    (verl_run / "checkpoints" / "global_step_2" / "actor" / "fsdp_config.json").unlink()
    _refused(_suite("eval", verl_run), "not a complete verl FSDP checkpoint")
    shutil.rmtree(verl_run / "checkpoints")
    _refused(_suite("eval", verl_run), "holds no checkpoint")
    (tmp_path / "val.parquet").unlink()
    _refused(_suite("eval", verl_run), "val.parquet: no such data file")
    assert not (verl_run / "eval").exists()
