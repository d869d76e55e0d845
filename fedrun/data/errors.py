"""Errors of the data layer."""


class DataError(ValueError):
    """A data file or data setting is invalid; the one-line message names the file or field."""
