"""`suite ARGS` through the CLI's own entry point inside the test process (tests/ is on sys.path:
`from cli_here import suite_here`). A refusal needs no process of its own, and each `suite`
subprocess costs ~2-3 s of imports on 2 cores; tests that check many refusals send one through a
real `suite` process and the rest through this."""

from __future__ import annotations

import contextlib
import io
import types


def suite_here(*args):
    """Run `suite ARGS` here: its exit status and what it printed (returncode, stdout, stderr)."""
    from suite.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:  # a refusal returns 2 or exits 2 (`sys.exit(main())` either way)
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())
