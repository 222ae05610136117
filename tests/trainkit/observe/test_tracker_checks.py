"""`output.tracker` before training: `<output.dir>/tensorboard` (or `wandb`) being a file is one
line naming it, exit 2, no step run (was a FileExistsError traceback from SummaryWriter); wandb
starts offline unless WANDB_MODE says otherwise, its init wait bounded, and a run it cannot start
(online without a network) is one line, not a hang. wandb is a stand-in module here when the venv
lacks it (the calls trainkit makes, recorded)."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.errors import ConfigError
from trainkit.observe.trackers import WANDB_INIT_SECONDS, WandbTracker
from trainkit_fixtures import cli_run

SETS = ("train.steps=2", "output.log_every=1", "parallel.fsdp=none")


@pytest.mark.parametrize("tracker", ["tensorboard", "wandb"])
def test_a_tracker_folder_that_is_a_file_is_refused_before_training(tracker, shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                      monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", _stand_in(calls=[]))
    out = tmp_path / "run"
    out.mkdir()
    (out / tracker).write_text("not a folder")
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", f"output.tracker={tracker}", *SETS)
    assert code == 2 and err == f"trainkit: output.dir {out / tracker}: is a file; output.tracker = '{tracker}' " \
                                f"writes its files in this folder", err
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def _stand_in(calls: list, fail: Exception | None = None) -> types.ModuleType:
    """A `wandb` module recording init's keywords; init raises `fail` when given."""
    wandb = types.ModuleType("wandb")

    class Settings:
        def __init__(self, **kw):
            self.kw = kw

    def init(**kw):
        calls.append(kw)
        if fail is not None:
            raise fail
        return types.SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)

    wandb.Settings, wandb.init = Settings, init
    return wandb


def test_wandb_starts_offline_with_a_bounded_wait(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _stand_in(calls))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    WandbTracker(tmp_path, {}).close()
    assert calls[0]["mode"] == "offline" and calls[0]["settings"].kw == {"init_timeout": WANDB_INIT_SECONDS}


def test_wandb_that_cannot_start_is_one_line(shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    """WANDB_MODE=online with no network: wandb.init gives up (its CommError after init_timeout) and
    the run stops in one line before any step."""
    calls: list = []
    monkeypatch.setitem(sys.modules, "wandb", _stand_in(calls, fail=TimeoutError("Run initialization has timed "
                                                                                 "out after 30.0 sec.")))
    monkeypatch.setenv("WANDB_MODE", "online")
    out = tmp_path / "run"
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", "output.tracker=wandb", *SETS)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "wandb could not start a run (WANDB_MODE=online: TimeoutError: Run initialization has timed out" in err
    assert calls and calls[0]["mode"] == "online"
    with pytest.raises(ConfigError, match="unset WANDB_MODE to log offline"):
        WandbTracker(tmp_path, {})
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
