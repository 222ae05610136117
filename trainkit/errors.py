"""trainkit's errors: each `str(err)` is one line naming the thing at fault and the problem.

They are raised before any GPU work (config, shard folder, slot mapping, world size, memory
cap), so a bad launch fails in seconds on every rank with the same message."""
from __future__ import annotations


class TrainkitError(Exception):
    """Base error: `str(err)` is a one-line message meant for the user."""


class ConfigError(TrainkitError):
    """The config names an unknown key, a value of the wrong type, or an impossible combination."""

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}")


class DataError(TrainkitError):
    """The shard folder cannot feed this model (not datakit output, a missing camera, ...)."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class LaunchError(TrainkitError):
    """The launch does not fit the job: world size vs batch, memory estimate vs cap."""
