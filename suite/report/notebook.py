"""The report notebook: built with nbformat, executed with nbclient, exported to HTML.

The notebook sits in the report directory and reads the tidy frames saved beside it
(`data/runs.csv`, `data/history.csv`), so a reader can open it and re-run every cell without
the tracking server; its first cell also shows the `load_runs(...)` call that reads the same
runs from MLflow again. Tables are rendered as HTML with the paper's values shaded amber and
the measured values shaded blue, so the two are told apart at a glance.
"""

from __future__ import annotations

import html
import json
import os
import sys
import tempfile
from pathlib import Path

from suite.report.tables import MEASURED_LABEL, PAPER_LABEL, Table

PAPER_BG = "#fdf0d5"  # amber: published values (their models, GPUs, benchmarks)
MEASURED_BG = "#e3eefb"  # blue: the runs at hand
NOTEBOOK_LINE = 120  # the house line limit (pyproject.toml [tool.ruff] line-length); ruff checks committed notebooks
EXEC_TIMEOUT_S = 600  # per cell

_CSS = """
<style>
table.suite-report { border-collapse: collapse; font-size: 12.5px; margin: 6px 0 18px 0; }
table.suite-report th, table.suite-report td { border: 1px solid #c8c8c8; padding: 3px 7px; text-align: left;
  vertical-align: top; }
table.suite-report th { background: #f2f2f2; font-weight: 600; }
table.suite-report td.paper { background: %s; }
table.suite-report th.paper { background: %s; }
table.suite-report td.measured { background: %s; }
table.suite-report th.measured { background: %s; }
table.suite-report td.missing { color: #a33; font-style: italic; }
p.suite-caption { font-size: 12.5px; color: #333; max-width: 70em; }
span.suite-key-paper { background: %s; padding: 1px 6px; }
span.suite-key-measured { background: %s; padding: 1px 6px; }
</style>
""" % (PAPER_BG, PAPER_BG, MEASURED_BG, MEASURED_BG, PAPER_BG, MEASURED_BG)


def _kind(col: str, value=None, source: str | None = None) -> str:
    if source is not None:
        return "paper" if source.startswith(PAPER_LABEL) else "measured"
    if col.startswith(f"{PAPER_LABEL}:"):
        return "paper"
    if col.startswith(f"{MEASURED_LABEL}:"):
        return "measured"
    return ""


def html_table(table: Table) -> str:
    """A Table as an HTML block: title, caption, colour key, and cells classed paper/measured."""
    df = table.text
    by_row = "source" in df.columns
    head = "".join(f'<th class="{_kind(c)}">{html.escape(str(c))}</th>' for c in df.columns)
    rows = []
    for _, r in df.iterrows():
        src = str(r["source"]) if by_row else None
        cells = []
        for c in df.columns:
            v = "" if r[c] is None else str(r[c])
            cls = [_kind(c, source=src)] if (by_row or _kind(c)) else []
            if v in ("missing", "—") and c not in ("not averaged",):
                cls.append("missing" if v == "missing" else "")
            cells.append(f'<td class="{" ".join(x for x in cls if x)}">{html.escape(v)}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    key = ""
    if any(_kind(c) for c in df.columns) or by_row:
        key = ('<p class="suite-caption"><span class="suite-key-paper">paper: published (their models, GPUs, '
               'benchmarks)</span> &nbsp; <span class="suite-key-measured">measured: the runs at hand</span></p>')
    return (f"{_CSS}<h3>{html.escape(table.title)}</h3><p class=\"suite-caption\">{html.escape(table.caption)}</p>{key}"
            f'<table class="suite-report"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>')


def build_notebook(source: dict, table_names: list[str], figure_names: list[str], summary_md: str):
    """The report notebook (nbformat v4): re-computes the tables and figures from data/*.csv."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    # the commented MLflow call, one argument per line so the notebook keeps the house line limit
    # (a run id and an absolute store path overflow one line); a single value too long for any line says so
    args = [f"{source.get('tracking_uri')!r},", f"experiment={source.get('experiment')!r},",
            f"filter_string={source.get('filter') or ''!r},",
            f"parent_run_id={source.get('parent_run_id') or None!r})"]
    load_lines = ["# d = D.load_runs("] + [f"#     {a}" for a in args] + ["# runs, history = d.runs, d.history"]
    load_call = "\n".join(x if len(x) <= NOTEBOOK_LINE else f"{x}  # noqa: E501" for x in load_lines)
    cells = [
        new_markdown_cell(
            "# QuRL / QaRL report\n\n"
            f"{summary_md}\n\n"
            "Every table and figure below is recomputed from the tidy run data saved next to this notebook "
            "(`data/runs.csv`: one row per run; `data/history.csv`: one row per run x step). "
            "Re-run all cells to regenerate them; to read the runs from MLflow again, use the commented line "
            "in the next cell.\n\n"
            f"<span style='background:{PAPER_BG};padding:1px 6px'>paper</span> = published values (their models, "
            f"GPUs and benchmarks); <span style='background:{MEASURED_BG};padding:1px 6px'>measured</span> = "
            "the runs at hand. Only FINISHED runs are averaged; the others are listed at the end."),
        new_code_cell(
            "import pandas as pd\n"
            "from IPython.display import HTML, Image, display\n"
            "from pathlib import Path\n"
            "from suite.report import data as D, plots as P, tables as T\n"
            "from suite.report.notebook import html_table\n"
            "\n"
            "runs = D.coerce_runs(pd.read_csv('data/runs.csv', dtype={c: str for c in D.TEXT_COLUMNS}))\n"
            "history = pd.read_csv('data/history.csv')\n"
            f"{load_call}\n"
            "paper = T.load_paper('paper') if Path('paper').exists() else T.load_paper()\n"
            "bench = pd.read_csv('data/bench.csv') if Path('data/bench.csv').exists() else None\n"
            f"tables = T.build_tables(runs, paper, n_resamples={source.get('n_resamples')}, "
            f"seed={source.get('ci_seed')}, bench=bench)\n"
            "print(len(runs), 'runs:', T.status_counts(runs))"),
    ]
    for name in table_names:
        cells.append(new_code_cell(f"display(HTML(html_table(tables[{name!r}])))"))
    cells.append(new_markdown_cell("## Figures"))
    cells.append(new_code_cell(
        "figs = P.build_figures(runs, history, tables['throughput'].data)\n"
        "for name, fig in figs.items():\n"
        "    P.save(fig, Path('figures'), name)"))
    for name in figure_names:
        cells.append(new_code_cell(f"display(Image(filename='figures/{name}.png'))"))
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.validate(nb)
    return nb


def _kernel_manager(tmp: str):
    """A kernel that runs this very interpreter (the one that has `suite` installed), from a
    kernelspec written to a temporary folder, so execution does not depend on which
    `python3` kernel the machine's Jupyter knows about. It talks over IPC sockets in that folder,
    not TCP on localhost: private to this user, and ipykernel warns about unencrypted TCP."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    spec_dir = Path(tmp) / "kernels" / "suite-report"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (suite report)", "language": "python"}))
    ksm = KernelSpecManager(kernel_dirs=[str(Path(tmp) / "kernels")])
    return KernelManager(kernel_name="suite-report", kernel_spec_manager=ksm, transport="ipc",
                         ip=str(Path(tmp) / "kernel"))


def execute_and_export(nb, out: Path, timeout_s: int = EXEC_TIMEOUT_S) -> tuple[Path, Path]:
    """Execute `nb` in `out` (cwd), save it as report.ipynb and export report.html."""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    try:
        import ipykernel  # noqa: F401
    except ImportError as e:  # a declared dependency; a broken env gets a clear message
        raise RuntimeError("executing the report notebook needs ipykernel: "
                           "pip install -e . (or pip install ipykernel)") from e
    env_keep = os.environ.get("MPLBACKEND")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        with tempfile.TemporaryDirectory(prefix="suite-kernel-") as tmp:
            km = _kernel_manager(tmp)
            client = NotebookClient(nb, timeout=timeout_s, km=km, resources={"metadata": {"path": str(out)}})
            try:
                client.execute()
            finally:  # nbclient stops only kernels it made; ours would outlive the report and say so
                if km.has_kernel:
                    km.shutdown_kernel(now=True)
    finally:
        if env_keep is None:
            os.environ.pop("MPLBACKEND", None)
        else:
            os.environ["MPLBACKEND"] = env_keep
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    ipynb = out / "report.ipynb"
    nbformat.write(nb, str(ipynb))
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    page = out / "report.html"
    page.write_text(body, encoding="utf-8")
    return ipynb, page
