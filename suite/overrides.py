"""Hydra overrides as the suite takes them: parsed one at a time (an error names the override),
`hydra.*` refused, booleans typed. Light (no torch): `suite run` checks its overrides before composing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from suite.hydra_compat import hydra_refusal

if TYPE_CHECKING:  # omegaconf is imported where it is used: this module stays light
    from omegaconf import DictConfig


class ConfigError(ValueError):
    """A configuration value or combination that cannot run; the message names the key."""


def check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {message}")


_PARSED: dict = {}  # override line -> Hydra's Override (read-only once parsed)
_PARSER: list = []  # Hydra's override parser, made on first use


def parse_override(line: str):
    """Hydra's parse of one override line (its Override), each distinct line parsed once per
    process: a sweep's cells and a test's configs share most lines, and the suite only reads an
    Override after parsing it. Raises Hydra's parse error."""
    o = _PARSED.get(line)
    if o is None:
        if not _PARSER:
            from hydra.core.override_parser.overrides_parser import OverridesParser

            _PARSER.append(OverridesParser.create())
        o = _PARSED[line] = _PARSER[0].parse_overrides([line])[0]
    return o


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> list:
    """Hydra's parse of each override, one at a time so that an error names the override."""
    from hydra.errors import OverrideParseException

    parsed = []
    for line in overrides:
        try:
            o = parse_override(line)
        except OverrideParseException as exc:
            reason = str(exc).splitlines()
            raise ConfigError(
                f"override {line!r} does not parse ({reason[-2] if len(reason) > 1 else reason[0]}); values with "
                "shell or grammar characters need quotes, e.g. 'key=\"a value\"'") from None
        check(bool(o.key_or_group), f"override {line!r}", "has no key before '='")
        check(not o.is_hydra_override(), f"override {line!r}", hydra_refusal(o.key_or_group))
        parsed.append(o)
    return parsed


def check_override_types(cfg: DictConfig, parsed: list) -> None:
    """A boolean key takes true or false only: OmegaConf would read 2, yes or on as true."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.nodes import BooleanNode

    for o in parsed:
        if o.is_delete() or o.is_sweep_override() or o.is_hydra_override():
            continue
        node = OmegaConf.select(cfg, o.key_or_group, throw_on_missing=False)
        parent_key, _, leaf = o.key_or_group.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        child = parent._get_node(leaf) if isinstance(parent, DictConfig) and leaf in parent else None
        if isinstance(child, BooleanNode) and node is not None:
            value = o.value()
            check(isinstance(value, bool), o.key_or_group, f"must be true or false, got {value!r}")


def apply_value_overrides(cfg: DictConfig, parsed: list) -> bool:
    """Apply parsed `key=value`, `+key=value` and `++key=value` overrides to `cfg` in order, with
    OmegaConf's public API, as Hydra applies them after its defaults list (Hydra's docs, "Basic
    Override syntax": `key=value` changes a key that exists, `+key=value` adds one that does not,
    `++key=value` sets it either way). False (cfg then half-changed: discard it) when one needs
    Hydra's own handling or error: `+key` over an existing value, or a value OmegaConf refuses."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for o in parsed:
        key, value = o.key_or_group, o.value()
        try:
            if o.is_add():
                if (OmegaConf.select(cfg, key, throw_on_missing=False) is not None
                        and not isinstance(value, (dict, list))):
                    return False
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
            elif o.is_force_add():
                OmegaConf.update(cfg, key, value, merge=True, force_add=True)
            else:
                OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException:
            return False
    return True


def first_line(exc: BaseException) -> str:
    """An exception's message as one line: OmegaConf's and PyYAML's add lines of context (`full_key: ...`,
    `object_type=...`, a caret under the text); the one line keeps the message and the key it is about."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    line = lines[0] if lines else type(exc).__name__
    key = getattr(exc, "full_key", None)  # OmegaConf's: the key its message's later lines name
    return f"{key}: {line}" if isinstance(key, str) and key and key not in line else line


def with_cause(exc: BaseException) -> str:
    """`first_line(exc)`, then its cause's first line where it adds something (Hydra wraps OmegaConf's error)."""
    msg = first_line(exc)
    if exc.__cause__ is not None and first_line(exc.__cause__) not in msg:
        msg += f": {first_line(exc.__cause__)}"
    return msg


def yaml_problem(exc: Exception) -> str:
    """PyYAML's error as one line with its position ("expected ..., but found ... at line 2, column 1"); its own
    text spreads the context, the problem and a caret over several lines."""
    mark = getattr(exc, "problem_mark", None)
    parts = [p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p]
    text = ", ".join(parts) or str(exc).strip().splitlines()[0]
    return f"{text} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else text
