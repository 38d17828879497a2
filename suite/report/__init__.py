"""Reports: the papers' tables and figures regenerated from tracked runs (`suite report`).

    from suite.report.data import load_runs
    from suite.report.build import write_report
    data = load_runs("sqlite:///mlflow.db", experiment="suite")
    write_report(data, "reports/suite")

`data` reads MLflow into tidy frames, `tables` holds pure table functions, `plots` draws,
`notebook` builds and executes the report notebook, `build` writes a report directory and
`cli` is the verb. docs/reports.md describes the outputs.
"""
