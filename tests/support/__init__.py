"""Helpers the tests share (tests/ is on the path: `from support.models import ...`)."""
