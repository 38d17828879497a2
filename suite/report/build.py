"""Write a whole report directory from a `RunData`:

    OUT/data/runs.csv, history.csv, source.json   the tidy frames the notebook reads
    OUT/paper/paper_*.csv                         the published values used (from analysis/)
    OUT/tables/<name>.csv|.md|.tex                every table
    OUT/figures/<name>.png|.svg                   every figure
    OUT/report.md                                 all tables in one Markdown page, figures linked
    OUT/report.ipynb, OUT/report.html             the executed notebook and its HTML export
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

from suite.report import plots, tables
from suite.report.data import RunData


def _say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"suite report: {msg}", file=sys.stderr, flush=True)


def write_report(
    data: RunData,
    out: str | Path,
    *,
    paper_dir: str | Path | None = None,
    n_resamples: int = tables.N_RESAMPLES,
    ci_seed: int = tables.CI_SEED,
    notebook: bool = True,
    quiet: bool = True,
    bench: pd.DataFrame | None = None,
) -> dict:
    """Write every table, figure and (unless `notebook=False`) the executed notebook to `out`.
    Returns {"out", "tables", "figures", "notebook", "html", "timings_s", "status"}."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    timings = dict(data.timings_s)
    t = time.perf_counter()
    (out / "data").mkdir(exist_ok=True)
    data.runs.to_csv(out / "data" / "runs.csv", index=False)
    data.history.to_csv(out / "data" / "history.csv", index=False)
    source = {**data.source, "n_resamples": n_resamples, "ci_seed": ci_seed,
              "generated_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    (out / "data" / "source.json").write_text(json.dumps(source, indent=1, default=str) + "\n")
    if bench is not None and not bench.empty:  # `suite bench vllm` rows: the notebook reads them back
        bench.to_csv(out / "data" / "bench.csv", index=False)
    paper_src = Path(paper_dir) if paper_dir else tables.analysis_dir()
    paper = tables.load_paper(paper_src)
    (out / "paper").mkdir(exist_ok=True)
    for f in paper_src.glob("paper_*.csv"):
        shutil.copyfile(f, out / "paper" / f.name)
    timings["write_data"] = time.perf_counter() - t

    t = time.perf_counter()
    built = tables.build_tables(data.runs, paper, n_resamples, ci_seed, bench)
    table_paths = {name: tab.write(out / "tables") for name, tab in built.items()}
    timings["tables"] = time.perf_counter() - t
    _say(f"{len(built)} tables written in {timings['tables']:.1f} s -> {out / 'tables'}", quiet)

    t = time.perf_counter()
    figs = plots.build_figures(data.runs, data.history, built["throughput"].data)
    fig_paths = {name: plots.save(fig, out / "figures", name) for name, fig in figs.items()}
    timings["figures"] = time.perf_counter() - t
    _say(f"{len(figs)} figures written in {timings['figures']:.1f} s -> {out / 'figures'}", quiet)

    counts = tables.status_counts(data.runs)
    src = data.source
    what = (f"Runs from `{src.get('tracking_uri')}`"
            + (f", experiment `{src['experiment']}`" if src.get("experiment") else ", all experiments")
            + (f", filter `{src['filter']}`" if src.get("filter") else "")
            + (f", sweep `{src['sweep']}`" if src.get("sweep") else "")
            + (f", parent run `{src['parent_run_id']}`" if src.get("parent_run_id") else "")
            + f". Status: {', '.join(f'{n} {s}' for s, n in counts.items()) or 'no runs'}."
            + f" Generated {source['generated_utc']}.")
    md = ["# QuRL / QaRL report", "", what, "", tables.PAPER_NOTE, ""]
    md += [tab.markdown() + "\n" for tab in built.values()]
    md += ["## Figures", ""] + [f"![{n}](figures/{n}.png)" for n in figs]
    (out / "report.md").write_text("\n".join(md) + "\n", encoding="utf-8")

    result = {"out": str(out), "tables": {k: [str(p) for p in v] for k, v in table_paths.items()},
              "figures": {k: [str(p) for p in v] for k, v in fig_paths.items()}, "notebook": None, "html": None,
              "status": counts}
    if notebook:
        from suite.report.notebook import build_notebook, execute_and_export

        t = time.perf_counter()
        _say("executing the report notebook ...", quiet)
        nb = build_notebook(source, list(built), list(figs), what)
        ipynb, page = execute_and_export(nb, out)
        timings["notebook"] = time.perf_counter() - t
        result["notebook"], result["html"] = str(ipynb), str(page)
        _say(f"notebook executed and exported in {timings['notebook']:.1f} s -> {page}", quiet)
    result["timings_s"] = timings
    return result
