"""User-facing errors. Entry points print one line and exit 2 for these; anything else is a bug."""


class CsclipError(Exception):
    """Base class: the message names the thing that is wrong and how to fix it."""


class ConfigError(CsclipError):
    """A config file, field or override is invalid."""


class DataError(CsclipError):
    """Input data is missing, empty or malformed beyond per-row rejection."""


class CheckpointMismatch(CsclipError):
    """A checkpoint does not match the model config it is loaded into."""
