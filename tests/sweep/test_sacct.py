"""`suite status` reads SLURM states from one `sacct` call, parsed by the suite
(suite.sweep.states `parse_sacct`): checked on hand-written sacct output, with submitit's own
reader of the same text as an independent implementation."""

from __future__ import annotations

from suite.launch.slurm import parse_sacct

SACCT = """JobID|State
101|COMPLETED
101.batch|COMPLETED
101.extern|COMPLETED
102_0|RUNNING
102_1|CANCELLED by 0
102_[2-4,7%2]|PENDING
103_5|TIMEOUT
103_5.batch|CANCELLED
104_[9]|PENDING
"""

WANT = {"101": "COMPLETED", "102_0": "RUNNING", "102_1": "CANCELLED", "102_2": "PENDING", "102_3": "PENDING",
        "102_4": "PENDING", "102_7": "PENDING", "103_5": "TIMEOUT", "104_9": "PENDING"}


def test_states_of_jobs_array_tasks_and_pending_ranges():
    assert parse_sacct(SACCT) == WANT
    assert parse_sacct("JobID|State\n") == {} and parse_sacct("") == {}
    assert parse_sacct("State|JobID\nRUNNING|7_1\n") == {"7_1": "RUNNING"}  # columns by name


def test_submitit_reads_the_same_states():
    from submitit.slurm.slurm import SlurmInfoWatcher  # the oracle only: the suite does not use it

    theirs = {j: v["State"].split()[0] for j, v in SlurmInfoWatcher().read_info(SACCT).items()}
    assert theirs == WANT
