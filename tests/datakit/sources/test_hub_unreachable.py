"""`datakit convert lerobot/pusht out/` on a machine whose network cannot reach the Hub (issue 35,
item 7): one line naming the Hub id, exit 2, nothing written. Before the fix huggingface_hub's
`httpx.ConnectError` (not a ConnectionError, so not seen as a network failure) came out as a
102-line traceback and exit 1.

The Hub is made unreachable in-process: HF_HUB_OFFLINE off and the Hub endpoint a local port where
nothing listens (connection refused at once); the retry delays are zeroed so the five attempts take
no time.
"""
from __future__ import annotations

import socket

import pytest

from datakit.cli import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed on exit: nothing listens there


@pytest.mark.parametrize("src_arg", ["lerobot/pusht", "hf://datasets/lerobot/pusht"])
def test_an_unreachable_hub_is_one_line_naming_the_repo_and_exit_2(src_arg, tmp_path, capsys, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import HfFileSystem, constants

    from datakit.storage.retry import RetryPolicy

    monkeypatch.chdir(tmp_path)  # no local folder lerobot/pusht
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setattr(RetryPolicy, "delay", lambda self, retry: 0.0)
    HfFileSystem.clear_instance_cache()
    try:
        code = main(["convert", src_arg, str(tmp_path / "out"), "--workers", "1"])
    finally:
        HfFileSystem.clear_instance_cache()  # no instance with the dead endpoint for later tests
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-2000:]
    assert "error: lerobot/pusht: " in lines[0] and "cannot be reached" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
