"""Test-suite setup: the helpers in ``tests/leakcheck.py`` import as ``leakcheck`` from every
subfolder (pytest puts this file's folder on ``sys.path``)."""
