"""One run id, one result on every machine (suite.hardware).

Machine-dependent choices resolve at compose time into the run id; an AVX2-only machine is
reproduced on this one by the ISA caps PyTorch's own kernels honour (ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2), run in a subprocess so the cap is in force from the first import.
On an AVX2-only machine the "uncapped" side is AVX2 too, and the cross-machine checks compare
AVX2 with AVX2: they still pass, and still prove the resolution and the refusals.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from suite import hardware
from suite.config import compose_config, group_key, hardware_pins, identity_tags, run_id

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
NATIVE_HERE = hardware.cpu_features().int8_native and hardware.cpu_features().bf16_native


def _py(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def _compose_in(env: dict, overrides: list[str]) -> dict:
    code = f"""
        import json
        from suite.config import compose_config, run_id
        c = compose_config({overrides!r})
        print(json.dumps({{"id": run_id(c), "autocast": c.train.autocast, "kernels": c.quant.kernels,
                          "bf16_kernels": c.quant.bf16_kernels}}))
    """
    proc = _py(code, env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_auto_choice_is_concrete_in_the_composed_config():
    cfg = compose_config(["train.autocast=auto", "quant.kernels=auto", "quant.bf16_kernels=auto"])
    assert cfg.train.autocast in ("bf16", "fp32")
    assert cfg.quant.kernels in hardware.RESOLVED and cfg.quant.bf16_kernels in hardware.RESOLVED
    # the resolved values are what the run id hashes: writing them out gives the same run
    explicit = compose_config([f"train.autocast={cfg.train.autocast}", f"quant.kernels={cfg.quant.kernels}",
                               f"quant.bf16_kernels={cfg.quant.bf16_kernels}"])
    assert run_id(explicit) == run_id(cfg)


@pytest.mark.slow
def test_the_default_trainer_dtype_is_fp32_on_every_machine():
    here = _compose_in({}, [])
    avx2 = _compose_in(AVX2, [])
    assert here["autocast"] == avx2["autocast"] == "fp32"
    assert compose_config([]).train.autocast == "fp32"


def test_different_kernel_paths_never_share_a_run_id():
    ids = {run_id(compose_config([f"quant.kernels={k}", f"quant.bf16_kernels={b}"]))
           for k in ("native", "emulated") for b in ("native", "emulated")}
    assert len(ids) == 4
    assert run_id(compose_config(["train.autocast=bf16"])) != run_id(compose_config(["train.autocast=fp32"]))
    # ... and the seed-free group key separates them too, so a report never pools them
    keys = {group_key(compose_config([f"quant.kernels={k}"])) for k in ("native", "emulated")}
    assert len(keys) == 2
    assert group_key(compose_config(["seed=1"])) == group_key(compose_config(["seed=2"]))


@pytest.mark.skipif(not NATIVE_HERE, reason="this machine resolves like an AVX2 one: nothing to tell apart")
@pytest.mark.slow
def test_an_avx2_machine_resolves_auto_differently_and_gets_another_run_id():
    here = _compose_in({}, ["quant.kernels=auto", "quant.bf16_kernels=auto", "train.autocast=auto"])
    avx2 = _compose_in(AVX2, ["quant.kernels=auto", "quant.bf16_kernels=auto", "train.autocast=auto"])
    assert (here["kernels"], here["bf16_kernels"], here["autocast"]) == ("native", "native", "bf16")
    # int8 stays native: without VNNI it runs the suite's exact AVX2 kernel (the same sums)
    assert (avx2["kernels"], avx2["bf16_kernels"], avx2["autocast"]) == ("native", "emulated", "fp32")
    assert here["id"] != avx2["id"]


def test_explicit_choices_and_sweep_pins_compose_to_the_same_run_on_any_machine():
    cfg = compose_config(["quant=fp8"])
    pins = hardware_pins(cfg)
    assert pins == [f"train.autocast={cfg.train.autocast}", f"quant.kernels={cfg.quant.kernels}",
                    f"quant.bf16_kernels={cfg.quant.bf16_kernels}"]
    avx2 = _compose_in(AVX2, ["quant=fp8", *pins])
    assert avx2["id"] == run_id(cfg)


@pytest.mark.slow
def test_sweep_cells_carry_the_pins_of_the_machine_that_composed_them(tmp_path):
    from suite.sweep.spec import load_sweep

    path = tmp_path / "s.yaml"
    path.write_text(f"name: pins\nbase: [out_dir={tmp_path}]\nmatrix:\n  quant: [int8, bf16]\n")
    sweep = load_sweep(path)
    for cell in sweep.cells:
        assert cell.overrides[-3:] == hardware_pins(cell.cfg)
        # a compute node of the other kind composes the same cell into the same run
        assert _compose_in(AVX2, cell.overrides)["id"] == cell.run_id


def test_identity_tags_name_the_numerics():
    cfg = compose_config(["quant=fp8", "quant.fp8_granularity=block", "quant.kernels=emulated",
                          "quant.bf16_kernels=native", "train.autocast=bf16"])
    assert identity_tags(cfg) == {"trainer_dtype": "bf16", "kernels": "emulated", "bf16_kernels": "native",
                                  "fp8_granularity": "block", "uaq_group_lr_s": "1", "lr_factor": "1",
                                  "group_key": group_key(cfg)}
    assert identity_tags(compose_config(["quant=int8"]))["fp8_granularity"] == ""


def test_native_bf16_resolved_elsewhere_is_refused_on_an_avx2_machine_before_anything_is_created(tmp_path):
    db = tmp_path / "mlflow.db"
    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli", "run", "--no-progress", "quant=bf16", "quant.bf16_kernels=native",
         f"out_dir={tmp_path / 'runs'}", f"tracking.tracking_uri=sqlite:///{db}",
         f"warm_start.cache_dir={tmp_path / 'ws'}"],
        capture_output=True, text=True, timeout=300, env={**os.environ, **AVX2})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "quant.bf16_kernels=native" in proc.stderr and "AVX512-BF16" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert not db.exists()


def test_int8_gemm_without_vnni_is_inexact_so_native_int8_runs_the_exact_packed_kernel():
    """oneDNN's AVX2 u8s8 path multiplies into saturating int16 pairs: torch._int_mm with oneDNN
    capped below VNNI on a VNNI CPU is wrong on full-range codes (measured max error 79,918 on a
    64x256x96 product), so a run resolved to native int8 executes the suite's packed AVX2 kernel
    there (suite.embedded.qlinear.INT8_GEMMS), which is exact, as the float32 emulation is at
    this K."""
    code = """
        import torch
        from suite import hardware
        from suite.embedded import fused
        from suite.embedded.qlinear import int8_gemm_for
        g = torch.Generator().manual_seed(0)
        a = torch.randint(-128, 128, (64, 256), generator=g, dtype=torch.int8)
        b = torch.randint(-128, 128, (256, 96), generator=g, dtype=torch.int8)
        exact = a.long() @ b.long()
        int_mm_exact = torch.equal(torch._int_mm(a, b).long(), exact)
        assert int_mm_exact == hardware.int_mm_exact()
        packed = fused.int_mm_packed(a, fused.pack_weight(b.t().contiguous()), 96)
        print(int_mm_exact, torch.equal(torch.nn.functional.linear(a.float(), b.t().float()).long(), exact),
              torch.equal(packed.long(), exact), hardware.executed_kernels("native", "int8"),
              int8_gemm_for(True, torch.device("cpu")))
    """
    out = _py(code, AVX2)
    assert out.returncode == 0, out.stderr
    int_mm_exact, emulated_exact, packed_exact, executed, gemm = out.stdout.split()
    assert emulated_exact == packed_exact == "True"
    assert (executed, gemm) == ("native", "packed")
    if hardware.cpu_features().int8_native:  # here the cap really changes oneDNN's kernel
        assert int_mm_exact == "False"
    assert hardware.executed_kernels("native", "int8") == "native"


# ----------------------------------------------------------------------------- reproducibility

_PROBE = """
    import sys, torch
    from suite.core.quant import QuantScheme
    from suite.embedded.engine import RolloutEngine
    from suite.embedded.model import PRESETS, ModelConfig, Transformer, response_logprobs
    from suite import hardware
    torch.manual_seed(0)
    torch.set_num_threads(1)
    m = Transformer(ModelConfig(**{**PRESETS["tiny"], "vocab_size": 40}))
    prompts = [[1 + (i * 7 + j) % 30 for j in range(5 + i % 4)] for i in range(16)]
    out = {}
    for p, k in (("int8", "native"), ("int8", "emulated"), ("bf16", "emulated"), ("fp32", "native")):
        e = RolloutEngine(m, QuantScheme(p), kernels=hardware.executed_kernels(k, p), bf16_kernels="emulated")
        ro = e.generate(prompts, max_new_tokens=24, temperature=1.0, top_p=1.0, stop_id=0, pad_id=39,
                        generator=torch.Generator().manual_seed(1))
        out[f"{p}-{k}"] = (ro.tokens, ro.behav_logp)
        out[f"trainer-fp32-{p}-{k}"] = response_logprobs(m, ro.tokens, ro.attention_mask, ro.response_start, 1.0)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp = response_logprobs(m, ro.tokens, ro.attention_mask, ro.response_start, 1.0)[0]
        out[f"trainer-bf16-{p}-{k}"] = lp.float()
    torch.save(out, sys.argv[1])
"""


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    (d / "probe.py").write_text(textwrap.dedent(_PROBE))
    res = {}
    for name, env in (("here", {}), ("avx2", AVX2)):
        proc = subprocess.run([sys.executable, str(d / "probe.py"), str(d / f"{name}.pt")], capture_output=True,
                              text=True, timeout=300, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr
        res[name] = torch.load(d / f"{name}.pt")
    return res


@pytest.mark.slow
def test_int8_rollouts_native_and_emulated_are_bit_identical_on_one_machine(probes):
    for side in ("here", "avx2"):
        nat, emu = probes[side]["int8-native"], probes[side]["int8-emulated"]
        assert torch.equal(nat[0], emu[0]) and torch.equal(nat[1], emu[1]), side


def test_the_same_config_on_an_avx2_machine_agrees_within_the_documented_tolerance(probes):
    """docs/architecture.md "Hardware choices": float32 GEMMs sum in another order on AVX2, so
    numbers agree to float error, not bit for bit. Measured on an AVX-512 VNNI/BF16 EPYC:
    fp32 trainer log-probs 4.8e-7, bf16 engine 2.4e-7, int8 engine 4.9e-4 (a last-bit change
    moves an activation across an int8 rounding boundary now and then), bf16 trainer 2.2e-3."""
    here, avx2 = probes["here"], probes["avx2"]
    bounds = {"fp32": 1e-5, "bf16": 1e-5, "int8": 5e-3}
    for key, bound in bounds.items():
        k = "native" if key in ("fp32", "int8") else "emulated"
        (t1, b1), (t2, b2) = here[f"{key}-{k}"], avx2[f"{key}-{k}"]
        assert torch.equal(t1, t2), key  # the same tokens sampled
        assert (b1 - b2).abs().max().item() <= bound, (key, (b1 - b2).abs().max().item())
        fp32_gap = (here[f"trainer-fp32-{key}-{k}"] - avx2[f"trainer-fp32-{key}-{k}"]).abs().max().item()
        assert fp32_gap <= 1e-5, (key, fp32_gap)
        bf16_gap = (here[f"trainer-bf16-{key}-{k}"] - avx2[f"trainer-bf16-{key}-{k}"]).abs().max().item()
        assert bf16_gap <= 2e-2, (key, bf16_gap)


def test_the_verl_worker_extension_asks_for_amx_tiles_when_vllm_imports_it():
    """vLLM 0.31.0's CPU INT8 GEMM (sgl-kernel, on AMX CPUs) runs AMX tile instructions without
    asking Linux for the tile state, so a fresh vLLM worker died with SIGILL at its first INT8
    linear in about half the runs (a verl GRPO run on an AMX Xeon, 2 of 3; docs/verl.md, "AMX tile permission"). vLLM
    imports the worker extension in each worker before it loads the model, so that import asks.
    In a fresh process: no permission before, and after it exactly where the CPU has AMX."""
    code = ("from suite import hardware as h; before = h.amx_tiles_permitted(); import suite.verl.int8_hook; "
            "import torch; print(before, h.amx_tiles_permitted(), bool(torch.cpu._is_amx_tile_supported()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    before, after, amx = out.stdout.split()
    if before == "None":
        pytest.skip("this system cannot be asked for the AMX permission (Linux >= 5.16 on x86-64 can)")
    assert before == "False"  # torch and the suite ask for nothing at import
    assert after == amx, out.stdout
