"""The scenario catalogue: every way an MWMS job deadlocks, each with its
expected outcome.  See ``scenarios/catalogue.py`` and docs/scenarios.md."""
