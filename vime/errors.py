"""Exceptions with messages meant for users: what was wrong, the offending value, what to do."""


class VimeError(Exception):
    """Base class of every error Vime raises on purpose."""


class ConfigError(VimeError):
    """A flag, a config file key or a combination of them is invalid."""


class EnvError(VimeError):
    """An environment could not be made or misbehaved."""
