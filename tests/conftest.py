import os

from hypothesis import HealthCheck, settings

pytest_plugins = ["pytester"]

# Generated fault plans run real clusters (0.3-4 s each), so CI draws a few,
# the same ones every run (derandomize): a red CI means a regression, not a
# new draw.  `pytest tests/test_properties.py --hypothesis-profile=thorough`
# searches for real.
_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("mwms-ci", max_examples=5, derandomize=True, database=None, **_common)
settings.register_profile("thorough", max_examples=150, **_common)
settings.load_profile(os.environ.get("MWMS_HYPOTHESIS_PROFILE", "mwms-ci"))
