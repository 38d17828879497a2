"""Run one suite config with verl: ``run(cfg, run_dir) -> summary`` (the record written to
``run_dir/summary.json``; suite.verl.backend makes it the backend contract's ``RunSummary``).

Inside a SLURM allocation of ``backend.nnodes`` nodes, the runner is started once per node
(submitit: one task per node, the sweep's ``cluster=h100x8x4`` profile). Node 0 starts the Ray
head, waits until every node's Ray worker has joined, runs ``python3 -m verl.trainer.main_ppo
OVERRIDES`` (suite.verl.translate) against that cluster and stops Ray; the other nodes start a
Ray worker that blocks until the head goes away, then return the head's summary. With one node
no SLURM is needed: main_ppo starts its own local Ray.

Before the first launch node 0 makes the UAQ copy of the model (``suite uaq apply``) when
``uaq.s != 1``, and creates the MLflow run (tags: the run's axes, sweep tags, parent run) that
verl then logs into (verl's MLflow logger attaches to ``MLFLOW_RUN_ID``). verl checkpoints to
``run_dir/checkpoints`` with ``trainer.resume_mode=auto``, so a requeued job resumes. When
main_ppo exits 0 the summary is read back from MLflow (held-out ``val-core/.../mean@1`` at the
first and last evaluation) and written to ``run_dir/summary.json``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from omegaconf import DictConfig

from suite.tracking.cell_run import opener
from suite.tracking.lock import run_lock
from suite.tracking.rundir import RUN_FILE, SUMMARY_FILE, finished_summary
from suite.tracking.rundir import read_summary as read_run_summary
from suite.tracking.rundir import VERL_LOG_FILE as LOG_FILE
from suite.tracking.values import held_out_keys
from suite.verl.translate import loss_env, uaq_model_dir, verl_command

JOIN_TIMEOUT_S = 600  # how long the head waits for all Ray workers to join (s)
SUMMARY_WAIT_S = 900  # how long a worker node waits for the head's summary.json after Ray stops (s)


@dataclass(frozen=True)
class Allocation:
    """The nodes of this job and which one this process runs on."""

    nodes: tuple[str, ...]  # host names, first = Ray head
    node_rank: int  # index of this node in `nodes`
    cpus_per_node: int  # CPUs Ray may use per node
    job_id: str = ""  # SLURM job id ("" outside SLURM)


def slurm_allocation(env: Mapping[str, str] | None = None,
                     hostnames: Callable[[str], list[str]] | None = None) -> Allocation:
    """The allocation from SLURM's environment (``SLURM_JOB_NODELIST``, ``SLURM_NODEID``)."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise RuntimeError("backend.nnodes > 1 needs a SLURM allocation (SLURM_JOB_NODELIST is not set); "
                           "launch with launcher=slurm and a multi-node cluster profile")
    expand = hostnames or _scontrol_hostnames
    nodes = tuple(expand(nodelist))
    rank = int(env.get("SLURM_NODEID", env.get("SLURM_PROCID", "0")))
    cpus = int(env.get("SLURM_CPUS_PER_TASK") or env.get("SLURM_CPUS_ON_NODE") or os.cpu_count() or 1)
    return Allocation(nodes=nodes, node_rank=rank, cpus_per_node=cpus, job_id=env.get("SLURM_JOB_ID", ""))


def _scontrol_hostnames(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], check=True, capture_output=True, text=True)
    return [h for h in out.stdout.split() if h]


def run_command(cfg: DictConfig, run_dir: str) -> list[str]:
    """main_ppo argv for this run (the dry run prints the same for ``run_dir = <out_dir>/<run_id>``)."""
    return verl_command(cfg, run_dir)


def run_env(cfg: DictConfig, mlflow_run_id: str) -> dict[str, str]:
    """Environment exported before ``ray start`` on every node (Ray workers inherit it)."""
    return {
        "MLFLOW_TRACKING_URI": str(cfg.tracking.tracking_uri),
        "MLFLOW_RUN_ID": mlflow_run_id,
        "VERL_USE_EXTERNAL_PLUGINS": "auto",  # load the suite plugin (entry point verl.plugins)
        **loss_env(cfg),
    }


def node_script(cfg: DictConfig, run_dir: str, alloc: Allocation, mlflow_run_id: str) -> str:
    """The bash script node ``alloc.node_rank`` runs: Ray head + main_ppo, or a Ray worker."""
    b = cfg.backend
    port = int(b.ray_port)
    head = alloc.nodes[0]
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in run_env(cfg, mlflow_run_id).items())
    lines = [
        "#!/usr/bin/env bash",
        f"# suite verl run, node {alloc.node_rank} of {len(alloc.nodes)} "
        f"({'Ray head' if alloc.node_rank == 0 else 'Ray worker'})",
        f"# run dir: {os.path.abspath(run_dir)}",
        "set -euo pipefail",
        exports,
        f"export HEAD_HOST={shlex.quote(head)}",
        'export HEAD_IP=$(getent hosts "$HEAD_HOST" | awk \'{print $1; exit}\')',
        'export HEAD_IP=${HEAD_IP:-$HEAD_HOST}',
        f"export RAY_PORT={port}",
        f"export NNODES={len(alloc.nodes)}",
        f"export GPUS_PER_NODE={int(b.n_gpus_per_node)}",
        f"export CPUS_PER_NODE={int(alloc.cpus_per_node)}",
    ]
    if alloc.node_rank == 0:
        cmd = " ".join(shlex.quote(a) for a in run_command(cfg, run_dir))
        py = shlex.quote(b.python)
        lines += [
            'echo "suite verl: starting Ray head on $HEAD_HOST ($HEAD_IP:$RAY_PORT), waiting for $NNODES nodes"',
            'ray start --head --node-ip-address="$HEAD_IP" --port="$RAY_PORT" --num-gpus="$GPUS_PER_NODE" '
            '--num-cpus="$CPUS_PER_NODE" --disable-usage-stats',
            "trap 'ray stop >/dev/null 2>&1 || true' EXIT",
            f"{py} - <<'PY'",
            "import os, sys, time",
            "import ray",
            "ray.init(address='auto')",
            "want, start, last = int(os.environ['NNODES']), time.time(), -1",
            "while True:",
            "    alive = sum(1 for n in ray.nodes() if n['Alive'])",
            "    if alive != last:",
            "        print(f'suite verl: {alive}/{want} Ray nodes joined ({time.time() - start:.0f} s)', flush=True)",
            "        last = alive",
            "    if alive >= want:",
            "        break",
            f"    if time.time() - start > {JOIN_TIMEOUT_S}:",
            f"        sys.exit(f'suite verl: only {{alive}}/{{want}} Ray nodes joined within {JOIN_TIMEOUT_S} s')",
            "    time.sleep(5)",
            "PY",
            'export RAY_ADDRESS="$HEAD_IP:$RAY_PORT"',
            f"cd {shlex.quote(os.path.abspath(run_dir))}",
            cmd,
        ]
    else:
        lines += [
            f'echo "suite verl: node {alloc.node_rank} waiting for the Ray head at $HEAD_IP:$RAY_PORT"',
            f"for i in $(seq 1 {JOIN_TIMEOUT_S // 5}); do",
            '  (exec 3<>"/dev/tcp/$HEAD_IP/$RAY_PORT") 2>/dev/null && break',
            "  sleep 5",
            "done",
            'ray start --address="$HEAD_IP:$RAY_PORT" --num-gpus="$GPUS_PER_NODE" --num-cpus="$CPUS_PER_NODE" '
            "--disable-usage-stats --block || true",
            f'echo "suite verl: node {alloc.node_rank}: Ray head gone, worker stopped"',
        ]
    return "\n".join(lines) + "\n"


def _execute(argv: list[str], log_path: str, env: Mapping[str, str]) -> int:
    """Run ``argv``, teeing its output to ``log_path`` and to stdout (progress of a long run)."""
    with open(log_path, "ab") as log, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                       env=dict(env)) as p:
        assert p.stdout is not None
        for line in p.stdout:
            log.write(line)
            log.flush()
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
        return p.wait()


def _prepare_model(cfg: DictConfig, run_dir: str, log=print) -> str:
    """The model directory verl loads: the UAQ copy in the run's directory (made once, kept for
    a resume) when uaq.s != 1."""
    src, dst = os.path.normpath(cfg.backend.model_path), uaq_model_dir(cfg, run_dir)
    if dst == src or os.path.isfile(os.path.join(dst, "uaq.json")):
        return dst
    from suite.verl.hf_uaq import transform

    log(f"suite verl: UAQ s={cfg.uaq.s:g}: {src} -> {dst}")
    transform(src, dst, cfg.uaq.s, log=log)  # the run's own copy, made under the run's lock
    return dst


def _mlflow_run(open_run, tracking_uri: str) -> str:
    logger = open_run(catch_up=False)
    rid = logger.run_id  # created (or resumed) by the constructor; verl attaches and ends it
    if not rid:
        raise RuntimeError(f"could not create the MLflow run at {tracking_uri}")
    return rid


def read_summary(tracking_uri: str, mlflow_run_id: str) -> dict:
    """Held-out accuracy at the first and last evaluation from verl's MLflow metrics.

    verl logs ``val-core/<data_source>/<acc|reward>/mean@N`` (MLflow: ``mean_at_N``), N =
    ``rollout.val_kwargs.n``: ``mean@1`` for greedy validation, ``mean@32`` for QuRL's AIME
    Avg@32. The summary reads the largest N the run logged (its validation setting), ``acc``
    before ``reward``, the mean over data sources; ``val_n`` says which N. Where verl also logs
    ``best@N/mean`` (pass@N), ``final_pass_at_n`` is its last value (mean over sources).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    logged = client.get_run(mlflow_run_id).data.metrics
    n, acc = held_out_keys(logged)
    if not acc:
        raise RuntimeError(f"MLflow run {mlflow_run_id} has no val-core/*/acc|reward/mean_at_N metric "
                           f"(keys: {sorted(logged)})")

    def first_last(key: str) -> tuple[float, float, int]:
        hist = sorted(client.get_metric_history(mlflow_run_id, key), key=lambda m: (m.step, m.timestamp))
        return hist[0].value, hist[-1].value, hist[-1].step

    vals = [first_last(k) for k in acc]
    base, final = sum(v[0] for v in vals) / len(vals), sum(v[1] for v in vals) / len(vals)
    out = {"baseline_acc": base, "final_acc": final, "delta_acc": final - base, "steps": max(v[2] for v in vals),
           "metric_keys": acc, "val_n": n, "mlflow_run_id": mlflow_run_id}
    best = [k.replace(f"/mean_at_{n}", f"/best_at_{n}/mean") for k in acc]
    if n > 1 and all(b in logged for b in best):
        out["final_pass_at_n"] = sum(first_last(b)[1] for b in best) / len(best)
    return out


def _wait_for_run_id(run_dir: str, timeout_s: float = JOIN_TIMEOUT_S) -> str:
    """The MLflow run id node 0 records in run_dir/mlflow_run.json (Ray workers must inherit it:
    verl's logger starts a new run when MLFLOW_RUN_ID is empty)."""
    path = os.path.join(run_dir, RUN_FILE)
    deadline = time.time() + timeout_s
    while True:
        if os.path.isfile(path):
            with open(path) as fh:
                rid = json.load(fh).get("run_id") or ""
            if rid:
                return rid
        if time.time() > deadline:
            raise RuntimeError(f"node 0 recorded no MLflow run in {path} within {timeout_s:.0f} s")
        time.sleep(2)


def run(cfg: DictConfig, run_dir: str, *, env: Mapping[str, str] | None = None,
        execute: Callable[[list[str], str, Mapping[str, str]], int] = _execute,
        hostnames: Callable[[str], list[str]] | None = None, open_run=None) -> dict:
    """Run ``cfg`` with verl in ``run_dir``; returns the summary (``already_finished`` if done).

    ``execute`` starts the per-node script (tests replace it: verl needs GPUs); ``env`` and
    ``hostnames`` default to this process's SLURM environment and ``scontrol``; ``open_run``
    (suite.backend.OpenRun, handed down by suite.cell.run_cell) opens the MLflow run verl attaches to.
    """
    if cfg.backend.name != "verl":
        raise ValueError(f"suite.verl.runner runs backend=verl configs, got backend.name={cfg.backend.name!r}")
    env = dict(os.environ if env is None else env)
    if cfg.backend.device == "cpu":  # vLLM's CPU build: verl's CPU platform in the driver too
        from suite.verl.cpu_workarounds import VERL_CPU_DRIVER_ENV

        env.update(VERL_CPU_DRIVER_ENV)
        # the CPU path gives Ray one pretend GPU (num_gpus=1, suite.verl.cpu_workarounds), which Ray refuses
        # beside an empty CUDA_VISIBLE_DEVICES: what submitit's local executor sets for a job without GPUs
        if env.get("CUDA_VISIBLE_DEVICES") == "":
            del env["CUDA_VISIBLE_DEVICES"]
    os.makedirs(run_dir, exist_ok=True)
    summary_path = os.path.join(run_dir, SUMMARY_FILE)
    if (done := read_run_summary(run_dir)) is not None:  # a damaged one is moved aside by the head, under the lock
        return {**done, "already_finished": True}
    nnodes = int(cfg.backend.nnodes)
    if nnodes > 1:
        alloc = slurm_allocation(env, hostnames)
        if len(alloc.nodes) != nnodes:
            raise RuntimeError(f"backend.nnodes={nnodes} but the SLURM allocation has {len(alloc.nodes)} nodes: "
                               f"{', '.join(alloc.nodes)}; use a cluster profile with nodes: {nnodes}")
    else:
        alloc = Allocation(nodes=("127.0.0.1",), node_rank=0, cpus_per_node=os.cpu_count() or 1)

    script = os.path.join(run_dir, f"verl_node{alloc.node_rank}.sh")
    log_path = os.path.join(run_dir, LOG_FILE if alloc.node_rank == 0 else f"verl_node{alloc.node_rank}.log")
    if alloc.node_rank > 0:
        rid = _wait_for_run_id(run_dir)  # the head creates it before starting Ray
        _write(script, node_script(cfg, run_dir, alloc, rid))
        execute(["bash", script], log_path, env)
        deadline = time.time() + SUMMARY_WAIT_S
        while not os.path.isfile(summary_path):
            if time.time() > deadline:
                raise RuntimeError(f"node {alloc.node_rank}: Ray stopped but the head wrote no {summary_path}; "
                                   f"see {run_dir}/{LOG_FILE}")
            time.sleep(10)
        with open(summary_path) as fh:
            return {**json.load(fh), "already_finished": False}
    # Node 0 writes the run dir (MLflow run, scripts, verl's checkpoints, summary): one writer per
    # run id, the embedded runs' lock, so a second `suite run` of this id exits naming the holder.
    with run_lock(run_dir):
        return _run_head(cfg, run_dir, alloc, env, execute, script, log_path, open_run or opener(cfg, run_dir))


def _run_head(cfg: DictConfig, run_dir: str, alloc: Allocation, env: Mapping[str, str],
              execute: Callable[[list[str], str, Mapping[str, str]], int], script: str, log_path: str,
              open_run) -> dict:
    if (done := finished_summary(run_dir)) is not None:  # a holder finished it between run()'s check and the lock
        return {**done, "already_finished": True}
    nnodes = int(cfg.backend.nnodes)
    _write_config(cfg, run_dir)
    _prepare_model(cfg, run_dir)
    rid = _mlflow_run(open_run, cfg.tracking.tracking_uri)
    if nnodes > 1:
        _write(script, node_script(cfg, run_dir, alloc, rid))
        argv = ["bash", script]
    else:
        argv = run_command(cfg, run_dir)
        _write(script, "#!/usr/bin/env bash\n"
               + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in run_env(cfg, rid).items())
               + f"cd {shlex.quote(os.path.abspath(run_dir))}\n" + " ".join(shlex.quote(a) for a in argv) + "\n")
    print(f"suite verl: {' '.join(shlex.quote(a) for a in argv)}\n  log: {log_path}", flush=True)
    rc = execute(argv, log_path, {**env, **run_env(cfg, rid)})
    if rc != 0:
        raise RuntimeError(f"verl exited with status {rc}; see {log_path}")
    summary = read_summary(str(cfg.tracking.tracking_uri), rid)
    _write(os.path.join(run_dir, SUMMARY_FILE), json.dumps(summary, indent=2) + "\n")
    if cfg.backend.get("eval_after_train", False):
        evaluate_after_training(run_dir)
    return {**summary, "already_finished": False}


EVAL_AFTER_TRAIN = "bf16,rollout"  # the engines a paper-recipe cell is scored by after training


def evaluate_after_training(run_dir: str, log=print) -> bool:
    """`suite eval RUN_DIR --precision bf16,rollout` of the finished run (its last checkpoint). A
    failure leaves the trained run as it is and says how to score it by hand; True when it scored."""
    from suite.evaluation import EvalError
    from suite.evaluation.cli import eval_run

    try:
        eval_run(run_dir, EVAL_AFTER_TRAIN, None, "last", log=log)
        return True
    except (EvalError, RuntimeError, OSError, ImportError) as exc:
        log(f"suite verl: the run trained, but its evaluation failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:300] if str(exc) else ''}); score it with: "
            f"suite eval {run_dir} --precision {EVAL_AFTER_TRAIN}")
        return False


def _write_config(cfg: DictConfig, run_dir: str) -> None:
    """The resolved run config as run_dir/config.yaml (what `suite eval` and `suite export` read back)."""
    from omegaconf import OmegaConf

    from suite.tracking.rundir import CONFIG_FILE

    _write(os.path.join(run_dir, CONFIG_FILE), OmegaConf.to_yaml(cfg, resolve=True))


def _write(path: str, text: str) -> None:
    from suite.tracking.atomic import atomic_write

    atomic_write(path, lambda fh: fh.write(text.encode()))


__all__ = ["Allocation", "node_script", "read_summary", "run", "run_command", "slurm_allocation"]
