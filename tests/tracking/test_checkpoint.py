"""Checkpoints: atomic writes, keep-last-K, fallback past a damaged file, RNG round trip."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from suite.tracking import (
    checkpoint_path,
    list_checkpoints,
    load_latest_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)


def test_round_trip_and_naming(tmp_path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "step_in_epoch": 3, "name": "x",
             "hist": [1.5, 2.5]}
    path = save_checkpoint(tmp_path, 7, state)
    assert path == tmp_path / "checkpoints" / "step_00000007.pt" == checkpoint_path(tmp_path, 7)
    step, got = load_latest_checkpoint(tmp_path)
    assert step == 7 and got["step_in_epoch"] == 3 and got["name"] == "x" and got["hist"] == [1.5, 2.5]
    torch.testing.assert_close(got["model"]["w"], state["model"]["w"])


def test_no_checkpoint_is_none(tmp_path):
    assert load_latest_checkpoint(tmp_path) is None


def test_keeps_last_k_and_no_temporary_files(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    stale = tmp_path / "checkpoints" / ".step_00000001.pt.tmp.999999"  # from a killed writer
    stale.write_bytes(b"partial")
    for s in (1, 2, 3, 10, 11):
        save_checkpoint(tmp_path, s, {"s": s}, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 11]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_00000010.pt", "step_00000011.pt"
    ]
    save_checkpoint(tmp_path, 12, {"s": 12}, keep_last=3)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 11, 12]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_damaged_newest_falls_back_to_previous(tmp_path, caplog, damage):
    save_checkpoint(tmp_path, 1, {"v": torch.ones(1000)})
    newest = save_checkpoint(tmp_path, 2, {"v": torch.zeros(1000)})
    data = newest.read_bytes()
    newest.write_bytes({"truncate": data[: len(data) // 2], "garbage": os.urandom(len(data)),
                        "empty": b""}[damage])
    step, state = load_latest_checkpoint(tmp_path)
    assert step == 1 and torch.equal(state["v"], torch.ones(1000))
    assert "unreadable" in caplog.text
    assert newest.with_name(newest.name + ".corrupt").exists()  # moved aside, not reused
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1]


def test_all_damaged_raises_instead_of_restarting(tmp_path):
    p = save_checkpoint(tmp_path, 1, {"v": 1})
    p.write_bytes(b"\0" * 100)
    with pytest.raises(RuntimeError, match="none of the 1 checkpoints"):
        load_latest_checkpoint(tmp_path)


def test_unsafe_type_in_state_is_an_error_not_a_fallback(tmp_path):
    save_checkpoint(tmp_path, 1, {"ok": 1})
    save_checkpoint(tmp_path, 2, {"bad": np.float32(1.0).reshape(1)})  # ndarray: not weights_only
    with pytest.raises(Exception, match="Unsupported global"):
        load_latest_checkpoint(tmp_path)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]  # nothing moved aside


def test_kill_9_during_save_leaves_a_loadable_checkpoint(tmp_path):
    """A writer killed at an arbitrary instant: the newest visible file is always complete."""
    script = textwrap.dedent(f"""
        import sys, torch
        from suite.tracking import save_checkpoint
        big = torch.randn(2_000_000)  # 8 MB: a save takes a while
        s = 0
        while True:
            save_checkpoint({str(tmp_path)!r}, s, {{"step": s, "w": big}}, keep_last=2)
            if s == 2:
                print("saving", flush=True)
            s += 1
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"saving\n"
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    step, state = load_latest_checkpoint(tmp_path)
    assert step >= 2 and state["step"] == step and state["w"].shape == (2_000_000,)
    assert not list((tmp_path / "checkpoints").glob("*.corrupt"))


def draws(g: torch.Generator, r: random.Random, n: np.random.Generator) -> list:
    return [
        random.random(), np.random.rand(), torch.rand(3).tolist(), np.random.randn(),
        torch.rand(2, generator=g).tolist(), r.random(), n.normal(), n.integers(1 << 60),
    ]


def test_rng_state_round_trip_reproduces_draws(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    g, r, n = torch.Generator().manual_seed(4), random.Random(5), np.random.default_rng(6)
    gens = {"rollout": g, "tasks": r, "np": n}
    draws(g, r, n)  # move every stream off its seed
    np.random.randn()  # leave a cached gaussian in numpy's legacy state

    save_checkpoint(tmp_path, 0, {"rng": rng_state(gens)})
    expected = draws(g, r, n)
    draws(g, r, n)  # diverge

    _, state = load_latest_checkpoint(tmp_path)  # through torch.load(weights_only=True)
    set_rng_state(state["rng"], gens)
    assert draws(g, r, n) == expected


def test_set_rng_state_names_a_missing_generator():
    state = rng_state({"a": torch.Generator()})
    with pytest.raises(KeyError, match="'b'"):
        set_rng_state(state, {"b": torch.Generator()})
