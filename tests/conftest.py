"""Shared test setup.

Its presence makes pytest put the repository root on ``sys.path`` (``tests`` is a package), so any test
can import the shared helpers under ``tests.fakes`` and ``tests.integration`` whichever folder is run.
"""
