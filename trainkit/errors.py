"""trainkit's errors: each `str(err)` is one line naming the thing at fault and the problem.

Launch errors (config, shard folder, output.dir, slot mapping, world size, memory cap) are raised
before any GPU work, so a bad launch fails in seconds on every rank with the same message; resume
and non-finite errors are raised on every rank alike, since each decision is taken collectively.
The CLI prints `trainkit: <message>` and exits 2 for each of `USER_ERRORS`. Model code raises the
ValueError kinds at the end (a bad preset or batch, an unencodable prompt, unmappable weights)."""
from __future__ import annotations

from datakit.errors import DatakitError


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


class CheckpointError(TrainkitError):
    """A checkpoint cannot be resumed: none intact, planted (it would run code), or another run's
    (another dataset, model, seed or batch)."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class NonFiniteError(TrainkitError):
    """A step's loss or gradient norm is NaN or inf (train.on_nonfinite = "stop"), the parameters
    diverged, or a batch's state holds NaN/inf; the message names the step and the batch's rows."""


class BatchDataError(TrainkitError):
    """A batch cannot be built from its rows (a state holding NaN/inf cannot be tokenized); the
    trainer turns it into a NonFiniteError naming the step."""

    def __init__(self, rows: list[int], bad_rows: list[int], problem: str):
        self.rows, self.bad_rows, self.problem = rows, bad_rows, problem
        super().__init__(f"{problem} in rows {bad_rows} (batch rows {rows})")


class OutputDirError(TrainkitError):
    """output.dir cannot hold this run: a file, under a file, inside data.shards, or in use by another run."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"output.dir {self.path}: {problem}")


class ExportError(TrainkitError):
    """`trainkit export` cannot write OUT: inside the run or the dataset, a file, not empty (no
    --force), or unwritable (permissions, a read-only or full disk)."""

    def __init__(self, path: str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"OUT {self.path}: {problem}")


class Stopped(Exception):
    """The run was asked to stop (SIGTERM) and did, at a step boundary, after its final checkpoint.
    Not a user error: the CLI prints the one line and exits 128 + the signal (143 for SIGTERM), as
    a process the signal had killed would."""

    def __init__(self, signum: int, message: str):
        self.exit_code = 128 + signum
        super().__init__(message)


# --- raised by model code (trainkit/models/): ValueErrors, so a model is usable without the trainer
class ModelConfigError(ValueError):
    """A model config or batch is inconsistent (a width not divisible by the heads, a bad preset name...)."""


class TokenizerError(ValueError):
    """A prompt cannot be encoded (NaN state, a state longer than the text budget...)."""


class WeightsError(ValueError):
    """A checkpoint cannot be mapped to the model: an unknown layout, a missing key, a wrong shape.
    `file`: the checkpoint folder's file at fault, for the caller to name."""

    def __init__(self, problem: str, file: str = "model.safetensors"):
        self.file = file
        super().__init__(problem)


# a bad preset name or model field, a prompt that cannot be encoded, a datakit error naming its file
# (a garbage index.json, a damaged shard): one line to the user, exit 2 (trainkit/trials/run.py: "refused")
USER_ERRORS = (TrainkitError, ModelConfigError, TokenizerError, DatakitError)
