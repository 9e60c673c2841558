"""What a person sees of runs, beyond the verdict's text:

- ``pytest_report``: report sections, JUnit properties and the session
  summary, as pure functions the plugin glues to its hooks;
- ``timeline``: a run as a Chrome trace (Perfetto) and an SVG picture;
- ``console``: what ``harness run`` and ``harness explore`` print, their
  live status lines included.

It may import :mod:`harness.diagnosis` and :mod:`harness.core`; no pytest
and no TensorFlow.
"""
