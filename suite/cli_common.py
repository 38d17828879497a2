"""What the verbs share, below suite.cli and its plugins (which suite.cli imports by name, so
they import this, never suite.cli): `-h` that lists each config group and its options (run,
sweep, status, cancel, eval), and composing a config or exiting 2 with the reason."""

from __future__ import annotations

import argparse
import sys


def groups_help() -> str:
    """The config groups and their options, as `suite VERB -h` lists them under its usage. The
    groups live in suite.config's ConfigStore (its registries sit beside torch code), so it is
    imported here, only when help is asked for."""
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

    try:
        return compose_config(overrides)
    except (ConfigError, HydraException, OmegaConfBaseException) as exc:
        msg = str(exc)
        # a typo's ConfigError is the suite's one line; Hydra's text (its `+key` advice) is left out
        typo = isinstance(exc, ConfigError) and isinstance(exc.__cause__, HydraException)
        if exc.__cause__ is not None and str(exc.__cause__) not in msg and not typo:
            msg += f"\n{exc.__cause__}"
        print(f"suite: bad config: {msg}", file=sys.stderr)
        sys.exit(2)
