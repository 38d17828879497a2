"""What the verbs share, below suite.cli and its plugins (which suite.cli imports by name, so
they import this, never suite.cli): `-h` that lists each config group and its options (run,
sweep, status, cancel, eval), and composing a config or exiting 2 with the reason."""

from __future__ import annotations

import argparse
import sys


def groups_help() -> str:
    """The config groups and their options, as `suite VERB -h` lists them under its usage. The
    groups live in suite.config's ConfigStore, whose registries sit beside torch code (seconds to
    import), so the listing is kept in the user's cache under a key of the package's source files
    (their names, sizes and mtimes): any edit or upgrade lists them afresh, and `-h` stays well
    under two seconds once it has been asked for once (docs/bench.md, "-h")."""
    import os
    from pathlib import Path

    key = _source_key()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "suite" / f"groups-help-{key}.txt"
    try:
        return cache.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        pass
    text = _groups_help_text()
    try:  # best effort: a read-only home only makes the next `-h` as slow as this one
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, cache)
    except OSError:
        pass
    return text


def _source_key() -> str:
    """A digest of every .py file of the suite package (relative name, size, mtime in ns)."""
    import hashlib
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".yaml")):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{os.path.relpath(os.path.join(dirpath, name), root)}:{st.st_size}:{st.st_mtime_ns}\n"
                         .encode())
    return h.hexdigest()[:16]


def _groups_help_text() -> str:
    import suite.config  # noqa: F401  (registers the groups)
    from suite.hydra_compat import config_groups

    lines = ["config groups (GROUP=OPTION; then any key, e.g. uaq.s=1.0, as `suite run --cfg job` prints them;",
             "docs/config.md describes each):"]
    lines += [f"  {group:<11} {' | '.join(options)}" for group, options in config_groups().items()]
    return "\n".join(lines)


class GroupsHelp(argparse.Action):
    """`-h` for the verbs that take config overrides: the usage, then `groups_help()` (listing the
    groups costs a Hydra initialisation, so only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help()
        print("\n" + groups_help())
        parser.exit()


def compose_or_exit(overrides: list[str]):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from suite.config import ConfigError, compose_config
    from suite.overrides import first_line, with_cause

    try:
        return compose_config(overrides)
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        # a typo's ConfigError is the suite's one line; Hydra's text (its `+key` advice) is left out
        typo = isinstance(exc, ConfigError) and isinstance(exc.__cause__, HydraException)
        print(f"suite: bad config: {first_line(exc) if typo else with_cause(exc)}", file=sys.stderr)
        sys.exit(2)
