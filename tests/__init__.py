"""The test suite; a package so that helpers import as ``tests.support.*``."""
