"""Build (or load) every C++ extension of the engine now: ``python -m suite.embedded.prebuild``.

Each extension is otherwise built by the first process that needs it, and every other process
that wants it meanwhile waits on torch's build lock. Run this once on a cluster's shared cache
before a sweep's array, or beside a test session (tests/conftest.py does). Exit status 1 where
one cannot be built (the engine then runs its Python path: the same numbers, slower).
"""

from __future__ import annotations

import sys

from suite.embedded import cext, decode, fused


def build_all() -> dict[str, str | None]:
    """name -> None where the extension is built, else why not."""
    fused.available()
    decode.native_extension()
    return {name: cext.failure(name) for name in ("suite_int8_linear", "suite_decode_layers")}


if __name__ == "__main__":
    failed = build_all()
    for name, why in failed.items():
        print(f"{name}: {'built' if why is None else 'not built: ' + why}")
    sys.exit(1 if any(failed.values()) else 0)
