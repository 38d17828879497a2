"""What a driver asks the machine about its jobs: SLURM states from one `sacct` call, and
whether a local job's submitit controller is still alive."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# SLURM job states (sacct) -> cell states
SLURM_PENDING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "PREEMPTED"}
SLURM_RUNNING = {"RUNNING", "COMPLETING", "CONFIGURING", "STAGE_OUT", "RESIZING", "SIGNALING"}
SLURM_FAILED = {"FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL", "DEADLINE", "COMPLETED"}

def slurm_problem(timeout_s: float = 10.0) -> str | None:
    """Why this machine cannot submit to SLURM (None: it can): the client commands are missing, or
    `scontrol ping` reaches no controller (no slurm.conf, a controller that is down). Asked before
    a sweep or study creates anything; a missing configuration makes scontrol retry for a minute,
    so the answer is bounded."""
    import shutil

    missing = [c for c in ("sbatch", "srun", "scontrol") if shutil.which(c) is None]
    if missing:
        return (f"launcher=slurm: {', '.join(missing)} not found on PATH; run from a SLURM login node "
                "(or use launcher=local)")
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        first = err.strip().splitlines()[0][:200] if err.strip() else ""
        detail = f"no answer within {timeout_s:.0f} s" + (f": {first}" if first else "")
    except OSError as exc:
        detail = str(exc)
    else:
        if proc.returncode == 0 and " is UP" in proc.stdout:
            return None
        lines = [ln for ln in (proc.stderr + proc.stdout).strip().splitlines() if ln.strip()]
        detail = lines[-1][:200] if lines else f"exit {proc.returncode}"
    return (f"launcher=slurm: `scontrol ping` reaches no SLURM controller ({detail}); run from a login node of a "
            "configured cluster (slurm.conf, or SLURM_CONF), or use launcher=local")


def pid_alive(pid: int, folder: Path) -> bool:
    """Whether `pid` is a live (not zombie) submitit local controller of this sweep."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().split(")")[-1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().decode(errors="replace")
    except OSError:
        return False
    return "submitit.local._local" in cmd and str(folder) in cmd


def sacct(job_ids: list[str]) -> dict[str, str]:
    """job id (`123_4`) -> first word of its SLURM state, from one sacct call."""
    if not job_ids:
        return {}
    mains = sorted({j.split("_")[0] for j in job_ids})
    cmd = ["sacct", "-o", "JobID,State", "--parsable2"]
    for m in mains:
        cmd += ["-j", m]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"suite: sacct failed ({exc}); SLURM states unknown", file=sys.stderr)
        return {}
    info = parse_sacct(out)
    return {j: info[j] for j in job_ids if j in info}


_ARRAY = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")  # a pending array's tasks: 123_[0-3,7%2]


def parse_sacct(text: str) -> dict[str, str]:
    """`sacct -o JobID,State --parsable2` -> job id (`123`, `123_4`) -> first word of its state
    (`CANCELLED by 0` -> CANCELLED). Steps (`123_4.batch`) are skipped; a pending array's line
    (`123_[0-3,7%2]`) gives each of its tasks. Parsed here rather than by submitit's
    SlurmInfoWatcher (not public); its public `Job.state` caches ended states for the process,
    which a driver polling for requeued tasks cannot use."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split("|")
    if "JobID" not in header or "State" not in header:
        return {}
    i_id, i_state = header.index("JobID"), header.index("State")
    out: dict[str, str] = {}
    for line in lines[1:]:
        fields = line.split("|")
        if len(fields) <= max(i_id, i_state):
            continue
        jid, state = fields[i_id].strip(), (fields[i_state].split() or ["UNKNOWN"])[0]
        if not jid or "." in jid:
            continue
        m = _ARRAY.match(jid)
        if m is None:
            out[jid] = state
            continue
        for part in m.group(2).split(","):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()):
                for k in range(int(lo), int(hi or lo) + 1):
                    out[f"{m.group(1)}_{k}"] = state
    return out
