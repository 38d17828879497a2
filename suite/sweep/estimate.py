"""How long a sweep will take, for `suite sweep --dry-run`: per cell and in all, at the sweep's
parallelism.

- verl cells of a paper recipe: the recipe's expected H100-hours for one run (suite.recipes,
  `h100_hours`: rough estimates, said so in docs/recipes.md), scaled by the cell's steps and
  divided by the GPUs of one job (the cluster profile's nodes x gpus_per_node, or the
  resources given).
- embedded cells: this machine's own step time, the median `timing_s/step` (verl's metric name)
  of finished runs in the same out_dir with the same cost-relevant config (model, rollout size,
  precision), plus their held-out evaluations. None finished yet: no figure, and a hint to run
  one cell first (`--only seed=0`).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from omegaconf import OmegaConf

# the keys that set an embedded step's cost (the rest, e.g. the seed or the correction, barely move it)
_COST_KEYS = ("backend.name", "model.preset", "rollout.prompts_per_step", "algo.group_size",
              "rollout.max_new_tokens", "quant.precision", "task.name", "task.n_eval", "algo.name")
_SCAN_LIMIT = 300  # run dirs read per dry run: a large out_dir must not make a dry run slow


def _cost_key(cfg) -> tuple:
    return tuple(str(OmegaConf.select(cfg, k)) for k in _COST_KEYS)


def _measured(out_dir: str) -> dict[tuple, tuple[float, float]]:
    """(median s per step, median s per evaluation) of the finished runs under out_dir, by cost key."""
    steps: dict[tuple, list[float]] = {}
    evals: dict[tuple, list[float]] = {}
    root = Path(out_dir)
    if not root.is_dir():
        return {}
    for n, run in enumerate(sorted(p for p in root.iterdir() if (p / "summary.json").is_file())):
        if n >= _SCAN_LIMIT:
            break
        try:
            key = _cost_key(OmegaConf.load(run / "config.yaml"))
            with open(run / "metrics.jsonl", encoding="utf-8") as fh:
                for line in fh:
                    m = json.loads(line).get("metrics", {})
                    if "timing_s/step" in m:
                        steps.setdefault(key, []).append(float(m["timing_s/step"]))
                    if "timing_s/testing" in m:
                        evals.setdefault(key, []).append(float(m["timing_s/testing"]))
        except (OSError, ValueError, TypeError, AttributeError):
            continue  # a damaged or foreign run dir tells nothing about speed
    return {k: (statistics.median(v), statistics.median(evals.get(k) or [0.0])) for k, v in steps.items()}


def _gpus_per_job(sweep) -> int:
    prof = sweep.profile
    nodes = sweep.resources.nodes or (prof.nodes if prof else 1)
    gpus = sweep.resources.gpus_per_node if sweep.resources.gpus_per_node is not None else \
        (prof.gpus_per_node if prof else 0)
    return max(1, int(nodes) * int(gpus or 0))


def cell_hours(sweep, cell, measured: dict) -> tuple[float, float, str] | None:
    """(low, high) hours of one cell and where the figure comes from; None when unknown."""
    from suite.recipes import RECIPES

    cfg = cell.cfg
    if cfg.backend.name == "verl":
        recipe = RECIPES.get(str(cfg.backend.recipe or ""))
        if recipe is None or not recipe.h100_hours:
            return None
        recipe_steps = recipe.values["steps"].value if "steps" in recipe.values else cfg.steps
        gpus = _gpus_per_job(sweep)
        scale = cfg.steps / recipe_steps / gpus
        low, high = recipe.h100_hours
        return low * scale, high * scale, (f"recipe {cfg.backend.recipe}: ~{_num(low, high)} H100-hours a run of "
                                          f"{recipe_steps} steps (rough, docs/recipes.md), {gpus} GPUs a job")
    found = measured.get(_cost_key(cfg))
    if found is None:
        return None
    step_s, eval_s = found
    n_evals = cfg.steps // max(1, cfg.eval_every) + 2  # every eval_every steps, and the first and last
    hours = (cfg.steps * step_s + n_evals * eval_s) / 3600
    return hours, hours, f"{step_s:.2f} s a step measured here (median over finished runs in {cfg.out_dir})"


def _num(low: float, high: float) -> str:
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def _hours(low: float, high: float) -> str:
    def one(h: float) -> str:
        return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"
    return one(low) if abs(high - low) < 1e-9 else f"{one(low)} to {one(high)}"


def estimate_lines(sweep, parallel: int) -> list[str]:
    """The dry run's estimate: per cell (grouped by source), in all at `parallel` cells at once."""
    out_dirs = {str(c.cfg.out_dir) for c in sweep.cells if c.cfg.backend.name != "verl"}
    measured: dict = {}
    for d in out_dirs:
        measured.update(_measured(os.path.expanduser(d)))
    per_cell = [cell_hours(sweep, c, measured) for c in sweep.cells]
    known = [h for h in per_cell if h is not None]
    lines = []
    for source in dict.fromkeys(h[2] for h in known):
        group = [h for h in known if h[2] == source]
        low, high = min(h[0] for h in group), max(h[1] for h in group)
        lines.append(f"estimate per cell: {_hours(low, high)} ({len(group)} cells; {source})")
    unknown = len(per_cell) - len(known)
    if unknown:
        first = sweep.cells[0].axes
        key = "seed" if "seed" in first else next(iter(first), None)
        hint = f"e.g. `--only {key}={first[key]}`" if key else "e.g. one of its cells"
        lines.append(f"estimate per cell: none for {unknown} cells (no finished run like them in their out_dir "
                     f"yet, and no recipe figure): run some first, {hint}, and dry-run again")
    if known and not unknown:
        waves = math.ceil(len(per_cell) / max(1, parallel))
        # cells of one wave run side by side: a wave lasts as long as its longest cell
        low = sum(h[0] for h in per_cell) / max(1, parallel)
        high = max(h[1] for h in per_cell) * waves
        lines.append(f"estimate in all: {_hours(low, high)} ({len(per_cell)} cells, {parallel} at once: "
                     f"{waves} waves)")
    return lines
