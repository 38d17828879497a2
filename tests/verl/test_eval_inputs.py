"""`suite eval` of a verl run refuses bad input before anything is merged, served or written: an
unknown benchmark (the run's held-out data sources are listed), an engine verl runs have not, a missing
held-out file, a run without a checkpoint, a checkpoint of another model than the run's. The run
directory is a real verl run's layout (config.yaml, checkpoints/global_step_N/actor with verl's
fsdp_config.json and huggingface/config.json); merging and serving need vLLM (tests/vllm_cpu/test_verl_grpo.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from cli_here import suite_here
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
    _refused(suite_here("eval", verl_run, "--precision", "fp32"), "'fp32'", "bf16, rollout")
    _refused(suite_here("eval", verl_run, "--checkpoint", "7"), "'7'", "last, best, 2")
    hf = verl_run / "checkpoints" / "global_step_2" / "actor" / "huggingface" / "config.json"
    other = json.loads(hf.read_text())
    hf.write_text(json.dumps({**other, "hidden_size": other["hidden_size"] * 2}))
    _refused(suite_here("eval", verl_run), "holds another model", f"hidden_size {other['hidden_size'] * 2} there")
    hf.write_text(json.dumps(other))
    (verl_run / "checkpoints" / "global_step_2" / "actor" / "fsdp_config.json").unlink()
    _refused(suite_here("eval", verl_run), "not a complete verl FSDP checkpoint")
    shutil.rmtree(verl_run / "checkpoints")
    _refused(suite_here("eval", verl_run), "holds no checkpoint")
    (tmp_path / "val.parquet").unlink()
    _refused(suite_here("eval", verl_run), "val.parquet: no such data file")
    assert not (verl_run / "eval").exists()


@pytest.mark.parametrize("quant, expect", [("quant=int8", "requantize"), ("quant=w4a16", "int4"),
                                           ("quant=w4a16 quant.w4a16_kernels=emulated", "fake_quant"),
                                           ("quant=w4a16 quant.symmetric=false", "int4"),
                                           ("quant=bf16", "bf16"), ("quant=fp8 quant.fp8_granularity=block", "fp8"),
                                           ("quant=fp8 quant.fp8_granularity=per_channel", "requantize")])
def test_the_rollout_engine_is_the_checkpoint_a_sync_reproduces(tiny_qwen2, tmp_path, quant, expect):
    """What `suite eval --precision rollout` serves for each rollout precision, from a merged model:
    INT8 / per-channel FP8 / W4A16 the compressed-tensors checkpoint the weight sync reproduces (W4A16's
    packed int4 codes, unpacked, exactly the suite quantizer's), emulated W4A16 the weights rounded to the
    run's grid (every block linear exactly `fake_quant_weights`, the rest unchanged), block
    FP8 vLLM's own online quantization, bf16 the merged model itself."""
    import torch
    from safetensors.torch import load_file

    from suite.config import compose_config
    from suite.verl.evaluate import rollout_model
    from suite.verl.int8_hook import fake_quant_weights, is_quantized_linear
    from suite.verl.rollout_quant import rollout_scheme

    cfg = compose_config(["backend=verl", f"backend.model_path={tiny_qwen2}", "backend.train_files=/t",
                          "backend.val_files=/v", *quant.split()])
    model, extra, detail = rollout_model(cfg, tiny_qwen2, tmp_path / "rollout")
    if expect == "requantize":
        qc = json.loads((model / "config.json").read_text())["quantization_config"]
        assert qc["quant_method"] == "compressed-tensors" and "W8A8" in detail and extra == {}
    elif expect == "int4":
        from suite.core.quant import quantize_w4
        from suite.verl.int8_hook import unpack_int4

        qc = json.loads((model / "config.json").read_text())["quantization_config"]
        w = qc["config_groups"]["group_0"]["weights"]
        assert (qc["format"], w["num_bits"], w["group_size"], w["symmetric"]) == (
            "pack-quantized", 4, cfg.quant.group_size, cfg.quant.symmetric)
        assert "CompressedTensorsWNA16" in detail and extra == {}
        orig = {k: v for p in tiny_qwen2.glob("*.safetensors") for k, v in load_file(p).items()}
        got = {k: v for p in model.glob("*.safetensors") for k, v in load_file(p).items()}
        linears = [k for k in orig if is_quantized_linear(k)]
        assert linears
        for k in linears:
            base = k[: -len("weight")]
            q = quantize_w4(orig[k].float(), cfg.quant.group_size, cfg.quant.symmetric)
            codes = unpack_int4(got[base + "weight_packed"], orig[k].shape[1]).to(torch.int16)
            assert torch.equal(codes - (8 if cfg.quant.symmetric else 0), q[0].to(torch.int16)), k
            assert torch.equal(got[base + "weight_scale"], q[1].float()), k
            assert got[base + "weight_shape"].tolist() == list(orig[k].shape), k
            if not cfg.quant.symmetric:
                zeros = unpack_int4(got[base + "weight_zero_point"].t().contiguous(), orig[k].shape[0])
                assert torch.equal(zeros.t(), q[2]), k
        assert all(torch.equal(got[k], orig[k]) for k in orig if not is_quantized_linear(k))
    elif expect == "fake_quant":
        orig = {k: v for p in tiny_qwen2.glob("*.safetensors") for k, v in load_file(p).items()}
        got = {k: v for p in model.glob("*.safetensors") for k, v in load_file(p).items()}
        scheme = rollout_scheme("w4a16", group_size=cfg.quant.group_size, symmetric=cfg.quant.symmetric)
        want = dict(fake_quant_weights(orig.items(), scheme))
        assert set(got) == set(orig) and any(is_quantized_linear(k) for k in got)
        assert any(not torch.equal(got[k], orig[k]) for k in got if is_quantized_linear(k))  # really rounded
        for k in got:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
            assert is_quantized_linear(k) or torch.equal(got[k], orig[k])
        assert (model / "config.json").is_file() and "w4a16-rounded" in detail
        assert "W4A16 numerics on bf16 kernels" in detail
    elif expect == "fp8":
        assert model == tiny_qwen2 and extra == {"quantization": "fp8"}
    else:
        assert model == tiny_qwen2 and extra == {}


def test_held_out_rows_without_a_gradable_source_and_best_on_the_reported_sets_are_refused(verl_run, tmp_path):
    import pandas as pd

    _refused(_suite("eval", verl_run, "--checkpoint", "best"),
             "--checkpoint best: chosen on the validation of aime2024, olympiadbench, which it would then report")
    _refused(suite_here("eval", verl_run, "--checkpoint", "best", "--benchmarks", "aime2024",
                        "--select-on", "aime2024"),
             "chosen on the validation of aime2024")
    row = {"prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"style": "rule", "ground_truth": "2"}}
    val = tmp_path / "val.parquet"
    pd.DataFrame([row]).to_parquet(val)
    _refused(suite_here("eval", verl_run), "row 0 has no data_source")
    pd.DataFrame([{**row, "data_source": "codecontests"}]).to_parquet(val)
    _refused(suite_here("eval", verl_run), "data_source 'codecontests' has no grader", "backend.reward_fn_path")
    assert not (verl_run / "eval").exists()


def test_avg_at_1_and_pass_at_k_come_from_the_same_samples_keyed_apart():
    from suite.evaluation import Protocol, Score
    from suite.verl.evaluate import sample_metrics

    per_prompt = [[True, False, False, True], [False, False, False, False], [False, True, True, True]]
    assert sample_metrics(per_prompt, 4) == [("", 5, 12), ("mean@1", 1, 3), ("pass@4", 2, 3)]
    assert sample_metrics([[True], [False]], 1) == [("", 1, 2)]  # one sample: mean@1 is the protocol's own
    proto = Protocol(4, 0.6, 0.95, 32768)
    keys = [Score("aime2024", "bf16", "", proto, 20, 3, n, n / d, 1.0, "g", m).key for m, n, d in
            sample_metrics(per_prompt, 4)]
    assert keys == ["eval/aime2024/bf16/acc/mean@4", "eval/aime2024/bf16/acc/mean@1", "eval/aime2024/bf16/acc/pass@4"]
    a, b = (Score("aime2024", "bf16", "", proto, 20, 3, 1, 0.3, 1.0, "g", m) for m in ("", "mean@1"))
    assert not a.same_job(b) and a.same_job(Score("aime2024", "bf16", "x", proto, 20, 0, 0, 0.0, 0.0))
    assert Score.from_record({**a.to_record(), "metric": "pass@4"}).metric_name == "pass@4"
    old = {k: v for k, v in a.to_record().items() if k not in ("grader", "metric")}  # a record of an older suite
    assert Score.from_record(old).metric_name == "mean@4"


def test_eval_model_refuses_what_it_cannot_score_before_anything_exists(tiny_qwen2, tmp_path):
    import pandas as pd

    val = tmp_path / "val.parquet"
    pd.DataFrame([{"data_source": "aime2024", "prompt": [{"role": "user", "content": "1+1="}],
                   "reward_model": {"style": "rule", "ground_truth": "2"}}]).to_parquet(val)
    out = [f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    _refused(_suite("eval"), "give a run directory, a sweep file, or --model PATH")
    _refused(suite_here("eval", "--model", tmp_path / "nowhere", f"backend.val_files={val}", *out),
             "nowhere: not a Hugging Face model directory")
    _refused(suite_here("eval", "--model", tiny_qwen2, "recipe=qurl-deepscaler", *out), "backend.val_files=FILE")
    _refused(suite_here("eval", "--model", tiny_qwen2, f"backend.val_files={val}", "--benchmarks", "gsm8k", *out),
             "--benchmarks 'gsm8k': not one of aime2024")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        _refused(suite_here("eval", "--model", tiny_qwen2, f"backend.val_files={val}", *out), "needs vLLM")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()
