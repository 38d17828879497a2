"""The default run as tests/embedded/test_default_run.py runs it: the default experiment cut to 50
RL steps. tests/conftest.py trains its warm start (the same overrides, so the same cache key and,
on one thread, the same weights) in the background as the session starts."""

OVERRIDES = ["steps=50", "eval_every=25", "threads=1"]

TEST_FILE = "tests/embedded/test_default_run.py"
