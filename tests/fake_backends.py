"""A backend that cannot read anything, to test that `--decoder auto` falls back."""
from datakit.decoders.base import BackendUnavailable

NAME = "broken"


def version() -> str:
    return "0"


def open_video(path, *, threads=1, seek_mode="exact"):
    raise BackendUnavailable(f"broken cannot read {path}")
