"""suite: RL of language models with a quantized rollout actor (docs/architecture.md).

The package root wires the backends' config sections into suite.config, which imports no
backend itself: suite.verl.config registers ``backend=verl`` (it is light: no verl import).
"""

from suite.verl import config as _verl_config  # noqa: F401  (registers backend=verl)
