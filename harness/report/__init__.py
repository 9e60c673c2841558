"""What a person sees of finished runs, beyond the verdict's text:

- ``pytest_report``: report sections, JUnit properties and the session
  summary, as pure functions the plugin glues to its hooks;
- ``timeline``: a run as a Chrome trace (Perfetto) and an SVG picture.

It may import :mod:`harness.diagnosis` and :mod:`harness.core`; no pytest
and no TensorFlow.
"""
