"""What a metric logger receives, converted the same way by every sink: nested params
flattened to dotted keys, values stringified, metric values as floats."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings (and dataclass instances) -> one level with dotted keys.

    `{"optim": {"lr": 1e-3}}` -> `{"optim.lr": 0.001}`. Lists and other values are kept
    as leaves (they become one param each, stringified).
    """
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        if isinstance(value, Mapping):
            if value:
                flat.update(flatten_params(value, name))
            else:
                flat[name] = "{}"
        else:
            flat[name] = value
    return flat


def stringify(values: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in values.items()}



def to_float(key: str, value: Any) -> float:
    try:
        return float(value)  # python/numpy scalars and 0-d tensors
    except (TypeError, ValueError) as e:
        raise TypeError(f"metric {key!r}: {value!r} is not a number") from e


# verl's held-out metrics: val-core/<data_source>/<acc|reward>/mean@N, N = val_kwargs.n (MLflow: mean_at_N)
_MEAN_AT = re.compile(r"^val-core/(?P<source>.+)/(?P<var>acc|reward)/mean_at_(?P<n>\d+)$")


def held_out_keys(names: Iterable[str]) -> tuple[int, list[str]]:
    """The held-out accuracy keys among a run's metric ``names``: those of the largest N it logged
    (its validation setting: ``mean@1`` greedy, ``mean@32`` for an Avg@32), ``acc`` before
    ``reward``, one per data source, sorted. ``(0, [])`` when there is none."""
    found = [(m, k) for k in names if (m := _MEAN_AT.match(k))]
    if not found:
        return 0, []
    n = max(int(m["n"]) for m, _ in found)
    at_n = [(m, k) for m, k in found if int(m["n"]) == n]
    return n, (sorted(k for m, k in at_n if m["var"] == "acc") or sorted(k for m, k in at_n if m["var"] == "reward"))
