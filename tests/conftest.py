"""pytest configuration. Shared helpers live in tests/helpers.py (the one module tests import helpers from)."""
