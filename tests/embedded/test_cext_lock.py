"""A C++ extension build killed mid-way (Ctrl-C, SIGKILL, a job's time limit) leaves torch's
build lock, a file every later process waited on forever; the suite's builder lock (a flock the
kernel drops with its holder) finds it stale and removes it. Measured before the fix: two CI runs
started after a killed build hung at their first test until pytest-timeout killed it."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest

BUILD = ("from suite.embedded import cext; "
         "m = cext.build('suite_int8_linear', 'int8_linear.cpp', python_module=False, what='-'); "
         "print('built' if m else 'not built: ' + str(cext.failure('suite_int8_linear')))")


@pytest.mark.slow  # seconds with the session's build to copy; ~60 s of one core where it must build
def test_a_lock_left_by_a_killed_build_is_removed_not_waited_on(tmp_path):
    from torch.utils.cpp_extension import get_default_build_root

    from suite.embedded import cext

    disk = cext.build_name("suite_int8_linear", os.path.join(cext.CSRC, "int8_linear.cpp"))
    root = tmp_path / "ext"
    src = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    found = [d for d in glob.glob(os.path.join(src, "*", disk)) if glob.glob(os.path.join(d, "*.so"))]
    build_dir = root / disk  # where torch builds it under TORCH_EXTENSIONS_DIR (cpp_extension._get_build_directory)
    if found:  # the session's build, so that nothing needs compiling (mtimes kept: ninja finds it current)
        shutil.copytree(found[0], build_dir, ignore=shutil.ignore_patterns("lock"))
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "lock").write_text("")  # what a killed builder leaves
    proc = subprocess.run([sys.executable, "-c", BUILD], env={**os.environ, "TORCH_EXTENSIONS_DIR": str(root)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "built", proc.stdout + proc.stderr
    assert f"removing {build_dir / 'lock'}, left by a build of {disk} that was killed" in proc.stderr, proc.stderr
    assert not (build_dir / "lock").exists()
