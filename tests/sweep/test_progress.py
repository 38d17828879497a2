"""The live aggregate of sweeps and studies (suite.launch.progress): the line, its ETA, its pace
without a terminal, and the tqdm bar on one."""

from __future__ import annotations

import io

from suite.launch.progress import Progress, aggregate_line


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_the_line_and_its_eta_by_hand():
    # 2.5 of 5 units in 60 s: the other 2.5 take 60 s more
    assert aggregate_line("sweep q", 8, 2, 2, 1, 1, 60.0, 2.5, 5) == \
        "sweep q: 2/8 done, 2 running, 1 failed, 1 queued | 1.0 min elapsed, ETA 1.0 min"
    assert aggregate_line("t", 4, 0, 2, 0, 2, 30.0, 0.0, 4) == \
        "t: 0/4 done, 2 running, 0 failed, 2 queued | 0.5 min elapsed"
    assert aggregate_line("t", 4, 4, 0, 0, 0, 90.0) == "t: 4/4 done, 0 running, 0 failed, 0 queued | 1.5 min elapsed"


def test_without_a_terminal_a_line_every_interval():
    out, clock = io.StringIO(), Clock()
    p = Progress("sweep q", 4, stream=out, every_s=30, tty=False, clock=clock)
    for dt in (10, 10, 15, 10, 10):  # updates at t = 10, 20, 35, 45, 55 s: lines at 35 only (next due at 65)
        clock.t += dt
        p.update(1, 1, 0, 2, 1.5, 4)
    p.write("done   cell 3")
    clock.t += 10
    p.update(2, 1, 0, 1, 2.0, 4)  # t = 65: 65 s for 2 of 4 units, 65 s to go
    p.close()
    assert out.getvalue().splitlines() == [
        "sweep q: 1/4 done, 1 running, 0 failed, 2 queued | 0.6 min elapsed, ETA 1.0 min",
        "done   cell 3",
        "sweep q: 2/4 done, 1 running, 0 failed, 1 queued | 1.1 min elapsed, ETA 1.1 min",
    ]


def test_on_a_terminal_a_bar_with_the_aggregate():
    out = io.StringIO()
    p = Progress("sweep q", 4, stream=out, tty=True, clock=Clock())
    p.update(1, 2, 1, 0, 2.0, 4)
    p.write("done   cell 0")
    assert p.bar.n == 2  # finished cells, failed included
    p.close()
    text = out.getvalue()
    assert "sweep q" in text and "2/4" in text and "2 running, 1 failed, 0 queued" in text and "done   cell 0" in text
