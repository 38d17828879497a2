"""Every verl cell of the paper sweeps composes against verl's own ppo_trainer config and passes
verl's validate_config (real verl 0.9.1 on CPU; a tiny local Qwen2 model directory)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import json
import re

import pytest

pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")
pytestmark = pytest.mark.verl

from suite.config import ConfigError, compose_config  # noqa: E402
from suite.hardware import CpuFeatures  # noqa: E402
from suite.verl.aligned import ALIGNED_BACKENDS, parse_spec  # noqa: E402
from suite.verl.rollout_quant import FP8_CHANNEL_QUANT_CONFIG, w4a16_quant_config  # noqa: E402
from suite.verl.translate import (  # noqa: E402
    NEVER_TRUNCATE,
    W8A8_QUANT_CONFIG,
    VerlConfigComposer,
    compose_verl_config,
    uaq_model_dir,
    validate_verl_config,
    verl_command,
    verl_overrides,
)

REPO = Path(__file__).resolve().parents[2]
SWEEPS = ("main_table.yaml", "ablation_uaq.yaml", "qarl_tbpo.yaml", "ablation_acr.yaml", "qarl_schemes.yaml")
# Keys whose values differ between seeds / runs of one structural cell.
PER_RUN_KEYS = ("data.seed", "actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.rollout.seed",
                "trainer.experiment_name", "trainer.default_local_dir")


@pytest.fixture(scope="module")
def verl_paths(tiny_qwen2, tmp_path_factory):
    """backend=verl overrides pointing at the tiny model and (empty) local parquet paths."""
    data = tmp_path_factory.mktemp("data")
    for name in ("train.parquet", "val.parquet"):
        (data / name).write_bytes(b"")
    return [
        "backend=verl",
        f"backend.model_path={tiny_qwen2}",
        f"backend.train_files={data / 'train.parquet'}",
        f"backend.val_files={data / 'val.parquet'}",
        f"out_dir={tmp_path_factory.mktemp('runs')}",
    ]


def _cells(name: str, verl_base: list[str]):
    """[(label, composed cfg)] for every cell of experiments/<name> with the backend=verl overrides.

    The sweep loader (suite.sweep.spec.load_sweep) expands the file's own matrix / include /
    exclude rules and composes every cell with ``backend=verl`` as an extra override; a cell
    the verl backend refused would fail the whole file here.
    """
    import tempfile

    import yaml

    from suite.sweep.spec import SweepError, load_sweep

    path = REPO / "experiments" / name
    data = yaml.safe_load(path.read_text())
    if any("uaq.group_lr_s" in inc and inc["uaq.group_lr_s"] != 1.0 for inc in data.get("include") or []):
        # the per-group-LR control runs on the embedded backend only: refused by name, then left out
        with pytest.raises(SweepError, match="uaq.group_lr_s"):
            load_sweep(path, verl_base)
        data["include"] = [inc for inc in data["include"] if inc.get("uaq.group_lr_s", 1.0) == 1.0]
        tmp = Path(tempfile.mkdtemp()) / name
        tmp.write_text(yaml.safe_dump(data))
        path = tmp
    sweep = load_sweep(path, verl_base)
    return [(f"{name}#{c.index}", c.cfg) for c in sweep.cells]


@pytest.fixture(scope="module")
def uaq_siblings(tiny_qwen2):
    """UAQ copies of the tiny model for the s values the sweeps use (PPO's critic loads the model config)."""
    from suite.verl.hf_uaq import transform

    def make(cfg):
        dst = uaq_model_dir(cfg)
        if not os.path.isdir(dst):
            transform(tiny_qwen2, dst, cfg.uaq.s, verify_layers=1, log=lambda *_: None)

    return make


@pytest.fixture(scope="module")
def composer():
    return VerlConfigComposer()


def _structural(overrides: list[str]) -> tuple[str, ...]:
    return tuple(o for o in overrides if o.split("=", 1)[0].lstrip("+") not in PER_RUN_KEYS)


@pytest.mark.parametrize("name", SWEEPS)
@pytest.mark.slow
def test_every_sweep_cell_composes_and_validates(name, verl_paths, composer, uaq_siblings):
    """Each cell + backend=verl: verl overrides compose against ppo_trainer and pass validate_config,
    and the composed verl config carries what the cell means (_check_semantics)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not (REPO / "experiments" / name).is_file():
        pytest.fail(f"experiments/{name} is missing")
    parser = OverridesParser.create()
    checked: dict[tuple[str, ...], str] = {}
    cells = _cells(name, verl_paths)
    aligned = 0
    lines: set[str] = set()
    for label, cfg in cells:
        assert cfg.backend.name == "verl"
        aligned += bool(cfg.correction.aligned_forward)
        ov = verl_overrides(cfg)
        lines.update(ov)
        assert len({o.split("=", 1)[0] for o in ov}) == len(ov), f"{label}: a key is set twice"
        key = _structural(ov)
        if key in checked:
            continue
        uaq_siblings(cfg)
        vcfg = composer.compose(ov)
        validate_verl_config(vcfg)
        _check_semantics(cfg, vcfg, label)
        checked[key] = label
    assert len(checked) >= 3 and len(checked) <= len(cells)
    # every cell's overrides are valid Hydra syntax (Hydra parses each line on its own: once per line)
    parser.parse_overrides(sorted(lines))
    print(f"{name}: {len(cells)} cells, {len(checked)} distinct verl configs validated, "
          f"{aligned} with the aligned forward")


def _check_semantics(cfg, v, label):
    """The composed verl config carries what the suite config means (values read back from verl's tree)."""
    a, c, q = cfg.algo, cfg.correction, cfg.quant.precision
    ar = v.actor_rollout_ref
    assert v.algorithm.adv_estimator == {"ppo": "gae", "grpo": "grpo", "dapo": "grpo"}[a.name], label
    assert ar.rollout.n == a.group_size and ar.rollout.calculate_log_probs is True, label
    assert ar.actor.clip_ratio_low == a.clip_low and ar.actor.clip_ratio_high == a.clip_high, label
    assert ar.actor.loss_agg_mode == a.agg, label
    assert ar.model.path == uaq_model_dir(cfg) and v.trainer.total_training_steps == cfg.steps, label
    assert list(v.trainer.logger) == ["console", "mlflow"] and v.trainer.project_name == cfg.tracking.experiment, label
    rc = v.algorithm.rollout_correction
    from omegaconf import OmegaConf

    env = OmegaConf.select(v, "ray_kwargs.ray_init.runtime_env.env_vars") or OmegaConf.create({})  # none for bf16 naive
    if c.mode == "tis":
        assert (rc.rollout_is, rc.rollout_is_threshold, ar.actor.policy_loss.loss_mode) == \
            ("token", c.tis_cap, "vanilla"), label
    elif c.mode in ("naive", "bypass"):  # verl's stock pipeline / its bypass mode: no IS weight
        assert rc.rollout_is is None and ar.actor.policy_loss.loss_mode == "vanilla", label
        assert "SUITE_LOSS_PARAMS" not in env, label
    else:
        assert (rc.rollout_is, rc.rollout_is_threshold) == ("token", NEVER_TRUNCATE), label
        assert ar.actor.policy_loss.loss_mode == c.mode, label
        params = json.loads(env.SUITE_LOSS_PARAMS)
        assert params == ({"tis_cap": c.tis_cap} if c.mode == "acr" else
                          {k: c[k] for k in ("tbpo_delta_pos", "tbpo_delta_neg_low", "tbpo_delta_neg_high",
                                             "tbpo_seq_cap", "tbpo_seq_weight")}), label
    assert rc.bypass_mode is (c.mode == "bypass") and rc.rollout_is_batch_normalize is False, label
    if c.mode == "bypass":
        assert rc.loss_type == "ppo_clip", label
    assert all(isinstance(x, str) for x in env.values()), label
    # fp8: QuRL's per-channel FP8 through compressed-tensors and our sync, or verl's native block FP8
    block_fp8 = q == "fp8" and cfg.quant.fp8_granularity == "block"
    emulated = q == "w4a16" and cfg.quant.w4a16_kernels == "emulated"
    synced = {"int8": "int8", "w4a16": "w4a16_emulated" if emulated else "w4a16",
              "fp8": None if block_fp8 else "fp8_per_channel"}.get(q)
    assert ar.rollout.quantization == ("fp8" if block_fp8 else None), label
    kw = ar.rollout.get("engine_kwargs", {}).get("vllm", {}) or {}
    if synced:
        assert (kw["worker_extension_cls"] == "suite.verl.int8_hook.QuantizedWeightSyncExtension"
                and env.SUITE_ROLLOUT_QUANT == synced), label
    if synced in ("int8", "fp8_per_channel", "w4a16"):
        from omegaconf import OmegaConf

        want = {"int8": W8A8_QUANT_CONFIG, "fp8_per_channel": FP8_CHANNEL_QUANT_CONFIG,
                "w4a16": w4a16_quant_config(cfg.quant.group_size, cfg.quant.symmetric)}[synced]
        assert kw["quantization"] == "compressed-tensors", label
        assert OmegaConf.to_container(kw["hf_overrides"]) == {"quantization_config": want}, label
    else:
        assert "quantization" not in kw, label
    if not synced:
        assert "worker_extension_cls" not in kw and "SUITE_ROLLOUT_QUANT" not in env, label
    if cfg.correction.aligned_forward:
        scheme = parse_spec(env.SUITE_ALIGNED_FORWARD)
        assert scheme.precision == q, label
        if q == "w4a16":
            assert (scheme.group_size, scheme.symmetric) == (cfg.quant.group_size, cfg.quant.symmetric), label
        if block_fp8:  # verl's native FP8 rollout: 128x128 blocks
            assert (scheme.fp8_granularity, scheme.block_size) == ("block", 128), label
        elif q == "fp8":
            assert scheme.fp8_granularity == "per_channel", label
        # the aligned engine applies to trainable engines only: verl's actor trains, its ref is forward-only
        fa, fr = ar.actor.fsdp_config, ar.ref.fsdp_config
        assert fa.strategy in ALIGNED_BACKENDS and not fa.forward_only and fr.forward_only, label
    else:
        assert "SUITE_ALIGNED_FORWARD" not in env, label
    assert (v.critic.enable is True) == (a.name == "ppo"), label
    assert v.algorithm.filter_groups.enable == bool(a.dynamic_sampling), label
    if a.name == "dapo":
        assert v.reward.reward_manager.name == "dapo", label
        if a.overlong_buffer:
            ob = v.reward.reward_kwargs.overlong_buffer_cfg
            assert (ob.enable, ob.len, v.reward.reward_kwargs.max_resp_len) == \
                (True, a.overlong_buffer, cfg.rollout.max_new_tokens)
    assert ar.actor.use_kl_loss == (a.kl_coef > 0), label


def test_fast_compose_equals_full_compose(verl_paths, composer, uaq_siblings):
    """VerlConfigComposer (defaults once, Hydra's override code per cell) == Hydra's compose."""
    from omegaconf import OmegaConf

    for extra in (["algo=ppo", "quant=int8", "correction=acr"], ["algo=dapo", "quant=fp8", "correction=tis"]):
        cfg = compose_config(verl_paths + extra)
        uaq_siblings(cfg)
        ov = verl_overrides(cfg)
        full, fast = compose_verl_config(ov), composer.compose(ov)
        assert OmegaConf.to_container(full) == OmegaConf.to_container(fast)


def test_unknown_verl_key_fails(verl_paths, composer):
    cfg = compose_config(verl_paths + ["quant=bf16",
                                       "backend.extra_overrides=['actor_rollout_ref.actor.no_such_knob=1']"])
    with pytest.raises(Exception, match="no_such_knob"):
        composer.compose(verl_overrides(cfg))


@pytest.mark.slow
def test_verl_rejects_what_it_cannot_run(verl_paths):
    with pytest.raises(ConfigError, match=r"quant.precision='fp32'.*bf16, fp8, int8, w4a16"):
        compose_config(verl_paths + ["quant=fp32"])
    with pytest.raises(ConfigError, match="backend.extra_overrides.*strategy=megatron.*fsdp, fsdp2, fsdp_turbo"):
        compose_config(verl_paths + ["quant=w4a16", "correction.aligned_forward=true",
                                     "backend.extra_overrides=['actor_rollout_ref.actor.strategy=megatron']"])
    compose_config(verl_paths + ["quant=w4a16", "correction.aligned_forward=true",
                                 "backend.extra_overrides=['actor_rollout_ref.actor.strategy=fsdp2']"])
    with pytest.raises(ConfigError, match="backend.extra_overrides.*lora_rank=8.*allowed.*: 0"):
        compose_config(verl_paths + ["quant=int8", "correction.aligned_forward=true",
                                     "backend.extra_overrides=['actor_rollout_ref.model.lora_rank=8']"])
    with pytest.raises(ConfigError, match="task.eval_samples.*embedded only.*allowed: 0"):
        compose_config(verl_paths + ["quant=int8", "task.eval_samples=32"])
    with pytest.raises(ConfigError, match="backend.model_path"):
        compose_config(["backend=verl"])
    with pytest.raises(ConfigError, match="backend.tensor_parallel_size"):
        compose_config(verl_paths + ["backend.tensor_parallel_size=3"])


def test_embedded_defaults_unchanged():
    cfg = compose_config([])
    assert cfg.backend.name == "embedded" and list(cfg.backend.keys()) == ["name"]


def test_dry_run_prints_each_cells_exact_command(verl_paths, tmp_path, capsys):
    """`suite sweep FILE --dry-run backend=verl ...` prints the main_ppo argv the runner would start."""
    from suite.cli import main
    from suite.sweep.spec import load_sweep

    sweep_file = tmp_path / "verl_dry.yaml"
    sweep_file.write_text(
        "name: verl-dry\nbase:\n  algo: dapo\nmatrix:\n  quant: [int8, fp8]\n  correction: [tis, acr]\n"
    )
    overrides = [o for o in verl_paths if not o.startswith("backend=")]
    assert main(["sweep", str(sweep_file), "--dry-run", "backend=verl", *overrides]) == 0
    out = capsys.readouterr().out
    sweep = load_sweep(sweep_file, ["backend=verl", *overrides])
    assert len(sweep.cells) == 4
    for cell in sweep.cells:
        cmd = verl_command(cell.cfg, cell.run_dir)
        assert cmd[:3] == ["python3", "-m", "verl.trainer.main_ppo"]
        assert f"$ {shlex.join(cmd)}" in out, f"cell {cell.index}: command not printed"


def test_verl_rollouts_are_registered_precisions():
    """Every precision verl runs is one of the quantizer registry's; fp32 (no quantization) has no
    vLLM rollout, and quantizers marked `verl=False` (wa16) are embedded only. The config's choices for
    backend=verl are this table's keys."""
    from suite.core.quant import QUANTIZERS
    from suite.verl.config import VERL_PRECISIONS
    from suite.verl.rollout_quant import VERL_ROLLOUTS

    assert set(VERL_ROLLOUTS) == {n for n, q in QUANTIZERS.items() if not q.lossless and q.verl}
    assert VERL_PRECISIONS == tuple(VERL_ROLLOUTS)


# The CPU kinds the project's machines come in (docs/architecture.md, "CPU kinds"), as suite.hardware sees them
CPU_KINDS = {
    "avx2": CpuFeatures(False, False, False),  # e.g. AMD EPYC Zen 2/3
    "avx2+avx_vnni": CpuFeatures(False, False, False, avx_vnni=True),  # e.g. Intel Alder Lake
    "avx512_vnni+avx512_bf16": CpuFeatures(True, True, False),  # e.g. AMD EPYC Zen 4
    "amx": CpuFeatures(True, True, True, avx_vnni=True),  # e.g. Intel Sapphire Rapids
}
# what vLLM's CPU build serves on each: block fp8 needs AMX (its block-FP8 kernel), int8 a VNNI dot
# product or AMX; per-channel fp8 runs torch._scaled_mm everywhere
VLLM_CPU_SERVES = {
    "avx2": ("bf16", "w4a16", "fp8_per_channel", "w4a16_emulated"),
    "avx2+avx_vnni": ("bf16", "int8", "w4a16", "fp8_per_channel", "w4a16_emulated"),
    "avx512_vnni+avx512_bf16": ("bf16", "int8", "w4a16", "fp8_per_channel", "w4a16_emulated"),
    "amx": ("bf16", "fp8", "int8", "w4a16", "fp8_per_channel", "w4a16_emulated"),
}
ROLLOUT_OVERRIDES = {"bf16": ["quant=bf16"], "fp8": ["quant=fp8", "quant.fp8_granularity=block"],
                     "int8": ["quant=int8"], "w4a16": ["quant=w4a16"],
                     "fp8_per_channel": ["quant=fp8", "quant.fp8_granularity=per_channel"],
                     "w4a16_emulated": ["quant=w4a16", "quant.w4a16_kernels=emulated"]}
ROLLOUT_LABELS = {"fp8": "fp8 (quant.fp8_granularity=block)",
                  "fp8_per_channel": "fp8 (quant.fp8_granularity=per_channel)",
                  "w4a16_emulated": "w4a16 (quant.w4a16_kernels=emulated)"}


def test_fp8_granularity_picks_qurls_per_channel_fp8_or_verls_native_blocks(verl_paths, composer):
    """quant=fp8: per_channel (the default, QuRL's FP8) runs compressed-tensors FP8 re-quantized at
    each sync by our extension, block verl's native FP8 (rollout.quantization=fp8); both compose
    against verl's ppo_trainer and carry what they mean, with and without the aligned forward;
    per_tensor has no verl rollout and is refused naming the allowed values."""
    from suite.identity import identity_tags

    for granularity in ("per_channel", "block"):
        for extra in ([], ["correction=tbpo", "correction.aligned_forward=true"]):
            cfg = compose_config(verl_paths + ["quant=fp8", f"quant.fp8_granularity={granularity}", *extra])
            vcfg = composer.compose(verl_overrides(cfg))
            validate_verl_config(vcfg)
            _check_semantics(cfg, vcfg, f"fp8 {granularity} {extra}")
            assert identity_tags(cfg)["fp8_granularity"] == granularity
    with pytest.raises(ConfigError, match=r"quant.fp8_granularity='per_tensor' is not allowed; choose one of: "
                                          r"per_channel, block"):
        compose_config(verl_paths + ["quant=fp8", "quant.fp8_granularity=per_tensor"])


@pytest.mark.parametrize("kind", CPU_KINDS)
@pytest.mark.slow
def test_vllm_cpu_build_refuses_what_it_cannot_serve(verl_paths, kind, monkeypatch):
    """backend.device=cpu (vLLM's CPU build), on each CPU kind: what it does not serve there is
    refused at compose time naming quant.precision and what it needs; the rest composes, and the
    workers get verl's CPU platform (suite.verl.cpu_workarounds)."""
    import suite.hardware

    monkeypatch.setattr(suite.hardware, "cpu_features", lambda: CPU_KINDS[kind])
    served = VLLM_CPU_SERVES[kind]
    with pytest.raises(ConfigError, match=r"backend.device='tpu'.*cuda, cpu"):
        compose_config(verl_paths + ["quant=int8", "backend.device=tpu"])
    needs = {"fp8": r"it needs AMX", "int8": r"it needs a VNNI dot product \(AVX512-VNNI or AVX-VNNI\) or AMX: .*"
                                                r"saturating int16.*"}
    listed = re.escape(", ".join(ROLLOUT_LABELS.get(n, n) for n in ROLLOUT_OVERRIDES if n in served))
    for q, quant in ROLLOUT_OVERRIDES.items():
        if q in served:
            cfg = compose_config(verl_paths + [*quant, "backend.device=cpu"])
            assert "+ray_kwargs.ray_init.runtime_env.env_vars.SUITE_VERL_CPU='1'" in verl_overrides(cfg), q
        else:
            label = re.escape(ROLLOUT_LABELS.get(q, f"'{q}'"))
            with pytest.raises(ConfigError, match=rf"quant.precision: {label} is not served by vLLM's CPU build "
                                                  rf"\(backend.device=cpu\).*{needs[q]}; this build serves here: "
                                                  rf"{listed}$"):
                compose_config(verl_paths + [*quant, "backend.device=cpu"])
        compose_config(verl_paths + quant)  # a GPU build serves every one
    cfg = compose_config(verl_paths + ["quant=int8"])
    assert not any("SUITE_VERL_CPU" in o for o in verl_overrides(cfg))


def test_an_isa_cap_below_vnni_refuses_vllm_cpu_int8(verl_paths, monkeypatch):
    """With oneDNN capped at AVX2 (how an AVX2-only CPU's kernels are reproduced on a VNNI one,
    docs/architecture.md "CPU kinds") vLLM's int8 GEMM saturates, so int8 is refused; the
    AVX2_VNNI cap keeps a CPU's AVX-VNNI, and so int8, where the CPU has it."""
    from suite.hardware import proc_cpu_flags

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    with pytest.raises(ConfigError, match=r"quant.precision: 'int8' is not served .*saturating int16"):
        compose_config(verl_paths + ["quant=int8", "backend.device=cpu"])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2_VNNI")
    if "avx_vnni" in proc_cpu_flags():
        compose_config(verl_paths + ["quant=int8", "backend.device=cpu"])
    else:
        with pytest.raises(ConfigError, match=r"'int8' is not served"):
            compose_config(verl_paths + ["quant=int8", "backend.device=cpu"])


def test_cpu_run_overrides_compose_against_verls_config(verl_paths, composer):
    from suite.hardware import cpu_features
    from suite.verl.cpu_workarounds import VERL_CPU_OVERRIDES

    # vLLM's CPU build serves int8 only with a VNNI dot product or AMX (refused at compose without:
    # test_every_cpu_rollout_gets_the_worker_extension_once); w4a16 it serves on every kind
    quant = "int8" if cpu_features().int8_dot_exact else "w4a16"
    cfg = compose_config(verl_paths + [f"quant={quant}", "correction=acr", "backend.device=cpu",
                                       "backend.n_gpus_per_node=1"])
    o = verl_overrides(cfg)
    assert o[-len(VERL_CPU_OVERRIDES):] == list(VERL_CPU_OVERRIDES)
    vcfg = composer.compose(o)
    assert vcfg.trainer.device == "cpu" and vcfg.actor_rollout_ref.actor.strategy == "fsdp2"
    validate_verl_config(vcfg)


@pytest.mark.slow
def test_every_cpu_rollout_gets_the_worker_extension_once():
    """vLLM's CPU build packs 16-bit linears after loading, so a bf16 (or verl-native fp8) rollout on
    CPU needs the suite's extension to re-stage them at each weight sync, like int8 / w4a16 have it;
    on GPU a bf16 rollout runs verl's stock worker."""
    from suite.config import ConfigError, compose_config
    from suite.hardware import cpu_features
    from suite.verl.rollout_quant import WORKER_EXTENSION

    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls"
    base = ["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v"]
    for device, precision, want in (("cpu", "bf16", 1), ("cpu", "int8", 1), ("cpu", "w4a16", 1), ("cuda", "bf16", 0),
                                    ("cuda", "int8", 1)):
        over = [*base, f"backend.device={device}", f"quant={precision}"]
        if (device, precision) == ("cpu", "int8") and not cpu_features().int8_dot_exact:  # AVX2 only
            with pytest.raises(ConfigError, match="quant.precision: 'int8' is not served by vLLM's CPU build"):
                compose_config(over)
            continue
        o = verl_overrides(compose_config(over), "/tmp/r")
        got = [x for x in o if x.lstrip("+").startswith(key + "=")]
        assert len(got) == want and all(x.endswith("=" + WORKER_EXTENSION) for x in got), (device, precision, got)
        compose_verl_config(o)  # one value per key: Hydra refuses a second `+key=...`


def test_param_dtype_fp32_turns_fsdp_mixed_precision_off_in_every_trained_model(composer):
    """backend.param_dtype=fp32: FSDP's param_dtype fp32 (the embedded trainer's default numerics)
    for the actor, its reference and PPO's critic, in the engine configs verl builds them from;
    bf16 (verl's default) emits nothing and leaves run ids as they were."""
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from suite.config import run_id
    from suite.identity import identity_tags

    base = ["backend=verl", "backend.model_path=/m", "backend.train_files=/t", "backend.val_files=/v", "algo=ppo"]
    fp32 = composer.compose(verl_overrides(compose_config([*base, "backend.param_dtype=fp32"]), "/tmp/r"))
    want = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    for engine in (fp32.actor_rollout_ref.actor.fsdp_config, fp32.actor_rollout_ref.ref.fsdp_config, fp32.critic.fsdp):
        assert OmegaConf.to_container(engine.mixed_precision) == want
        assert omega_conf_to_dataclass(engine).mixed_precision == want  # verl's FSDPEngineConfig takes it
    default = compose_config(base)
    assert not any("mixed_precision" in o for o in verl_overrides(default, "/tmp/r"))
    assert run_id(default) == run_id(compose_config([*base, "backend.param_dtype=bf16"]))
    assert run_id(default) != run_id(compose_config([*base, "backend.param_dtype=fp32"]))
    # the report's trainer dtype column says which (a verl run's MLflow tag)
    assert identity_tags(default)["trainer_dtype"] == "bf16"
    assert identity_tags(compose_config([*base, "backend.param_dtype=fp32"]))["trainer_dtype"] == "fp32"
    with pytest.raises(ConfigError, match="backend.param_dtype='fp16' is not allowed; choose one of: bf16, fp32"):
        compose_config([*base, "backend.param_dtype=fp16"])
