"""Test-suite setup: the helpers in ``tests/leakcheck.py`` import as ``leakcheck`` from every
subfolder (pytest puts this file's folder on ``sys.path``)."""

from __future__ import annotations

import os

import pytest

from impala_gpu.calibration import CACHE_ENV
from impala_gpu.config import AUTO_TRIAL_ENV

# auto's end-to-end trials run seconds of training per workload: off for the suite (set before
# any Config exists; child processes inherit it). tests/test_calibration.py turns them on.
os.environ[AUTO_TRIAL_ENV] = "0"


@pytest.fixture(autouse=True, scope="session")
def _calibration_cache(tmp_path_factory):
    """``auto`` calibrates into a cache of this test session's own (child processes inherit
    it), never into the user's ~/.cache: tests measure this machine as it is now."""
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("calibration"))
    yield
