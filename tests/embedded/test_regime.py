"""`regime=paper` (suite.regimes): it composes to the values it documents, the command line still
wins, and it rolls out with a larger mismatch than the default run on a few real steps."""

import os
import statistics

import pytest
from hydra.errors import MissingConfigException
from test_run import run_cfg, tiny_cfg

from suite.config import ConfigError, compose_config, run_id
from suite.tracking.loggers import read_jsonl


def test_paper_regime_composes_to_its_documented_values():
    cfg = compose_config(["regime=paper"])
    assert cfg.quant.precision == "w4a16" and cfg.rollout.temperature == 1.5
    # the same run id as the same values given by hand: a regime is a shorthand, not an axis
    assert run_id(cfg) == run_id(compose_config(["quant=w4a16", "rollout.temperature=1.5"]))
    # the command line wins over the regime, in either order
    for overrides in (["regime=paper", "quant=int8"], ["quant=int8", "regime=paper"]):
        c = compose_config(overrides)
        assert c.quant.precision == "int8" and c.rollout.temperature == 1.5
    assert compose_config(["regime=paper", "rollout.temperature=1.0"]).rollout.temperature == 1.0
    # no regime: the default run, untouched
    assert run_id(compose_config([])) == run_id(compose_config(["quant=int8", "rollout.temperature=1.0"]))


def test_an_unknown_regime_names_the_options():
    # the suite's line naming the options, over Hydra's own error (the CLI prints both, exit 2)
    with pytest.raises(ConfigError, match="regime=nope: no such option; the options are paper") as err:
        compose_config(["regime=nope"])
    assert isinstance(err.value.__cause__, MissingConfigException)


def _median_k3(cfg):
    run_dir, _ = run_cfg(cfg)
    return statistics.median(e["metrics"]["rollout_corr/k3_kl"]
                             for e in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
                             if "rollout_corr/k3_kl" in e["metrics"])


@pytest.mark.slow  # ~10 s quiet: two short runs compared
def test_paper_regime_rolls_out_with_more_mismatch_than_the_default(tmp_path):
    """Median rollout_corr/k3_kl over 3 RL steps of the tests' tiny run (warm start of 150 steps),
    default (INT8, T = 1) / regime=paper (W4A16, T = 1.5), measured on each CPU kind
    (docs/architecture.md, "CPU kinds"):

    - AVX-512 VNNI/BF16 EPYC: 4.1e-5 / 3.5e-3 (85x)
    - AVX-512 + AMX Xeon: 3.4e-5 / 9.7e-4 (29x)
    - AVX2-only EPYC: 1.10e-4 / 1.05e-3 (9.6x); on the AMX Xeon capped to AVX2
      (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2): 1.09e-4 / 1.39e-3 (12.8x)

    The kinds differ by up to 3.6x in the regime's level and 3.3x in the default's (bf16 native or
    emulated, the warm start's float order). The bounds hold on each with margin: the regime at
    least 3x the default (the smallest ratio measured, 9.6x, is 3.2x above it) and at least 5e-4,
    a quarter of QuRL's starting KL of 0.002 (the smallest level measured, 9.7e-4, is 1.9x above)."""
    steps = ["steps=3", "eval_every=3", "uaq.s=1.0"]
    default = _median_k3(tiny_cfg(tmp_path / "default", *steps))
    paper = _median_k3(tiny_cfg(tmp_path / "paper", *steps, "regime=paper"))
    print(f"median k3_kl: default {default:.3g}, regime=paper {paper:.3g}")
    assert paper > 3 * default, (default, paper)
    assert paper > 5e-4, (default, paper)
