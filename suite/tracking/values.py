"""What a metric logger receives, converted the same way by every sink: nested params
flattened to dotted keys, values stringified, metric values as floats."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
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
