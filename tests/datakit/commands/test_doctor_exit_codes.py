"""`datakit doctor` exits 0 on warnings only (issue 35, item 7): a dataset convert accepts (an unused
task, a blank camera) passes, with its warnings printed; errors (a missing video) exit 1; `--strict`
(CI gates) exits 1 on warnings too. Before the fix any finding exited 1.
"""
from __future__ import annotations

from doctor_fixtures import FPS, H, TOP, W, doctor, v2_video
from datakit.synth import make_lerobot_dataset


def test_warnings_only_exit_0_strict_exits_1_errors_exit_1(tmp_path, capsys):
    src = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(8, 9), cameras=(TOP,),
                               blank_cameras=(), height=H, width=W, fps=FPS, codec="h264",
                               tasks=("pick", "place", "never done"))
    rc, rep = doctor(src)
    assert rc == 0 and [f["severity"] for f in rep["findings"]] == ["warning"] and not rep["clean"]
    assert "unused_task" in capsys.readouterr().out  # said, though it passes
    assert doctor(src, "--strict")[0] == 1
    v2_video(src, 1, TOP).unlink()  # an error: convert rejects it
    rc, rep = doctor(src)
    assert rc == 1 and "error" in {f["severity"] for f in rep["findings"]}
