"""The tree is clean under ruff as pyproject.toml configures it ([tool.ruff]: pycodestyle,
Pyflakes, 120 columns); the test extra installs the pinned ruff."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "suite", "tests", "scripts", "analysis", "benchmarks"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
