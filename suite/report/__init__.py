"""Reports: the papers' tables and figures regenerated from tracked runs (`suite report`).

    from suite.report.data import load_runs
    from suite.report.build import write_report
    data = load_runs("sqlite:///mlflow.db", experiment="suite")
    write_report(data, "reports/suite")

`data` reads MLflow into tidy frames (`identity`: what a run is, from its tags and params),
`cells` forms table rows (one configuration each), `stats` computes intervals, `tables` holds
the pure table functions, `paper` the published values and their pairing, `fmt` formats,
`plots` draws, `notebook` builds and executes the report notebook, `build` writes a report
directory and `cli` is the verb. docs/reports.md describes the outputs.
"""

BOOTSTRAP_MIN_N = 20  # seeds from which the percentile bootstrap replaces the t-interval (suite.report.stats)
