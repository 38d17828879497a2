"""suite: RL of language models with a quantized rollout actor (docs/architecture.md).

The package root imports nothing: `suite --help` and `suite status` load only what they use.
The backends' config sections are wired into suite.config by suite.config itself, which imports
them by name last (``BACKEND_MODULES``): suite.verl.config registers ``backend=verl``.
"""
