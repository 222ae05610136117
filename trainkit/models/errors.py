"""Errors raised by trainkit model code: one readable line that names the field and the problem."""
from __future__ import annotations


class ModelConfigError(ValueError):
    """A model config or batch is inconsistent (a width not divisible by the heads, a bad preset name...)."""


class TokenizerError(ValueError):
    """A prompt cannot be encoded (NaN state, a state longer than the text budget...)."""


class WeightsError(ValueError):
    """A checkpoint cannot be mapped to the model: an unknown layout, a missing key, a wrong shape."""
