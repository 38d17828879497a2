"""The shared pieces: interleaved timing, option parsing, tables."""

from __future__ import annotations

import pytest

from suite.bench.common import BenchError, interleaved, median, parse_ints, parse_list, spread, table


def test_interleaved_rotates_the_order_and_times_each_call():
    clock = [0.0]
    calls = []

    def variant(name, cost):
        def fn():
            calls.append(name)
            clock[0] += cost
        return fn

    fns = {"a": variant("a", 1.0), "b": variant("b", 2.0), "c": variant("c", 4.0)}
    times = interleaved(fns, repeats=3, warmup=1, timer=lambda: clock[0])
    # warm-up once each, then three rounds, each starting one variant later
    assert calls == ["a", "b", "c", "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0], "c": [4.0, 4.0, 4.0]}


def test_median_and_spread():
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert spread([1.0, 2.0, 4.0]) == pytest.approx(1.5)  # (4 - 1) / 2


def test_options_name_the_key_and_the_allowed_values():
    assert parse_list("--precisions", "fp32, int8", ("fp32", "int8")) == ["fp32", "int8"]
    with pytest.raises(BenchError, match=r"--precisions='int9' is not allowed; choose from: fp32, int8"):
        parse_list("--precisions", "fp32,int9", ("fp32", "int8"))
    assert parse_ints("--batch", "8,64") == [8, 64]
    with pytest.raises(BenchError, match=r"--batch=0 must be >= 1"):
        parse_ints("--batch", "8,0")
    with pytest.raises(BenchError, match=r"--batch='x' is not an integer"):
        parse_ints("--batch", "x")


def test_table_formats_rows():
    text = table([{"precision": "int8", "tokens_per_s": 1234.5, "ratio": 0.5, "ok": True}],
                 ["precision", "tokens_per_s", "ratio", "ok", "missing"])
    lines = text.splitlines()
    assert [c.strip() for c in lines[0].split("|")[1:-1]] == ["precision", "tokens_per_s", "ratio", "ok", "missing"]
    assert lines[1] == "|-----------|--------------|-------|-----|---------|"  # widths: the longest cell + 2
    assert [c.strip() for c in lines[2].split("|")[1:-1]] == ["int8", "1234", "0.5", "yes", "-"]
