"""`datakit encode` as a smoke test (issue 35, item 7):
- a documented way to make tiny random encoders: `python -m datakit.encode.tiny OUT` writes a Wan VAE
  (2.1 and 2.2 style), a umT5 text encoder and CLIP under OUT, which `datakit encode` then uses;
- the progress counts clips, not "frames" (before: "encode shards: 7/7 frames");
- `dreamzero_tiny` on frame shards says in one line that it trains with stand-in encoders (before:
  nothing said it).
"""
from __future__ import annotations

import pytest

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from encode_fixtures import source  # noqa: F401 - session fixture


@pytest.mark.timeout(300)
def test_the_tiny_encoders_command_then_encode_counts_clips(source, tmp_path, capsys):  # noqa: F811
    pytest.importorskip("diffusers")
    from datakit.cli import main as datakit_main
    from datakit.encode.tiny import main as tiny_main

    assert tiny_main([str(tmp_path / "enc")]) == 0  # `python -m datakit.encode.tiny OUT`, in this process
    made = capsys.readouterr().out
    assert {line.split()[0] for line in made.splitlines()} == {"wan2.1", "wan2.2", "text", "image"}
    code = datakit_main(["encode", str(source), str(tmp_path / "feat"), "--vae", str(tmp_path / "enc" / "vae22"),
                         "--text-encoder", str(tmp_path / "enc" / "text"), "--clip", "5", "--size", "32x64",
                         "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    progress = [x for x in err.splitlines() if x.startswith("encode ")]
    assert progress and all(" clips" in x and "frame" not in x for x in progress), err[-2000:]
    assert progress[-1].split(": ")[1].startswith("7/7 clips"), progress  # 2 + 1 + 2 + 2 clips of 5 frames


def test_dreamzero_tiny_on_frame_shards_says_it_uses_stand_in_encoders(shards_3cam, tmp_path, capsys):  # noqa: F811
    from trainkit.cli import main

    sets = [f"data.shards={shards_3cam}", f"output.dir={tmp_path / 'run'}", "train.steps=1", "parallel.fsdp=none",
            "train.micro_batch=2", "data.num_workers=0"]
    assert main(["run", "dreamzero_tiny", *[a for s in sets for a in ("--set", s)]]) == 0
    said = [x for x in capsys.readouterr().err.splitlines() if "stand-in encoders" in x]
    assert len(said) == 1 and said[0].startswith("trainkit: dreamzero on frame shards") and "datakit encode" in said[0]
