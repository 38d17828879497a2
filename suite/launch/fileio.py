"""Reading the suite's YAML files (sweeps, cluster profiles, tune files) and checking their
values, with errors that name the file and the key."""

from __future__ import annotations

import math
import os
import re
from dataclasses import fields
from typing import Any

from suite.overrides import yaml_problem

# Names that become directory names, SLURM job names or sbatch option values: no shell or path syntax.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_KEY_RE = re.compile(r"^(\+\+|\+|~)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(@[A-Za-z0-9_.]+)?$")
# Unquoted Hydra values that need no quoting (anything else is single-quoted, escaped).
_PLAIN_VALUE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")


class SweepError(ValueError):
    """A sweep file, override or cell that cannot run; the message names file, cell and key."""



def _unique_key_loader():
    """PyYAML's SafeLoader, except that a mapping with a key twice is an error (PyYAML keeps
    the last value silently: a duplicated axis would lose a whole column of the matrix)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error follows
                break
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r} (first at line {first.line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return UniqueKeyLoader


def read_yaml(path: str | os.PathLike, error: type[Exception] = None) -> tuple[str, Any]:
    """(text, data) of a YAML file read as UTF-8, duplicate keys refused; errors name the file."""
    import yaml

    error = error or SweepError
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the file as UTF-8") from None
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # a SafeLoader subclass: no arbitrary objects
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    return text, data


def format_value(value: Any) -> str:
    """A YAML scalar as a Hydra override value; strings that are not plain words are quoted,
    so a value is always one literal (Hydra grammar), never interpreted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if _PLAIN_VALUE_RE.match(value) and value.lower() not in ("null", "true", "false", "nan", "inf"):
            return value
        escaped = value.replace("\\", "\\\\").replace("'", "\\'")
        return f"'{escaped}'"
    raise TypeError(type(value).__name__)


def override_key(line: str) -> str:
    """The key of an override line without its +/++/~ prefix (`+a.b=1` -> `a.b`)."""
    key = line.split("=", 1)[0]
    return key.lstrip("+~")


def check_key(where: str, key: Any) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise SweepError(f"{where}: {key!r} is not a config key (e.g. quant, uaq.s, +tracking.tags.note)")
    return key


def scalar(where: str, key: str, value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise SweepError(f"{where}: key {key!r}: value {value!r} must be a scalar (string, number, bool, null)")
    try:
        return format_value(value)
    except TypeError:
        raise SweepError(f"{where}: key {key!r}: value of type {type(value).__name__} is not a scalar") from None
    except ValueError as exc:  # .inf / .nan: no run takes them, and a cell would fail only once started
        raise SweepError(f"{where}: key {key!r}: {exc}") from None


def axis_values(where: str, key: str, values: Any) -> list[str]:
    """An axis: a non-empty list of distinct scalars (a scalar is an axis of one value)."""
    if not isinstance(values, list):
        if isinstance(values, dict):
            raise SweepError(f"{where}: axis {key!r} must be a list of values, got a mapping")
        values = [values]
    if not values:
        raise SweepError(f"{where}: axis {key!r} has no values (empty list)")
    out = [scalar(where, key, v) for v in values]
    dup = sorted({v for v in out if out.count(v) > 1})
    if dup:
        raise SweepError(f"{where}: axis {key!r} lists {', '.join(dup)} more than once")
    return out


def typed(where: str, schema: type, data: Any):
    """Merge a YAML mapping onto a dataclass schema: unknown keys and bad types name the key."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SweepError(f"{where}: must be a mapping, got {type(data).__name__}")
    allowed = [f.name for f in fields(schema)]
    for k in data:
        if k not in allowed:
            raise SweepError(f"{where}: unknown key {k!r}; allowed: {', '.join(allowed)}")
    from omegaconf import OmegaConf

    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), data)
    except Exception as exc:  # noqa: BLE001 - OmegaConf's validation error carries the key
        msg = str(exc).splitlines()[0]
        key = getattr(exc, "full_key", None)
        raise SweepError(f"{where}: key {key!r}: {msg}" if key else f"{where}: {msg}") from None
    return OmegaConf.to_object(merged)


def check_positive(where: str, obj: Any, names: tuple[str, ...]) -> None:
    for n in names:
        v = getattr(obj, n)
        if v is not None and not (v > 0 and math.isfinite(v)):  # inf seconds: a poll loop that never polls
            raise SweepError(f"{where}: {n}={v!r} must be > 0 and finite")
