"""`datakit encode` with an encoder folder that does not load: one line naming the folder and the
reason, exit 2, never a traceback and never an encoder left at random init (decoy weights).
Cases: the wrong folder (a CLIP given as the text encoder), a truncated and a header-flipped
safetensors, a pickle named .safetensors (never unpickled), a config.json of absurd sizes (built
on the meta device, no memory), and a huge --size. Positive control: the intact folders load."""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from encode_fixtures import encoders, source  # noqa: F401
from datakit.cli import main
from datakit.encode.models import Encoders
from datakit.errors import ConfigError


def _broken(encoders, tmp_path: Path, case: str) -> tuple[str, Path]:  # noqa: F811
    """(the encoder's role, its broken folder)."""
    role = "text" if case in ("wrong folder", "decoy weights") else "wan2.1"
    folder = Path(shutil.copytree(encoders[role], tmp_path / case.replace(" ", "_")))
    weights = next(folder.glob("*.safetensors"))
    if case == "wrong folder":  # CLIP's folder as the text encoder
        shutil.rmtree(folder)
        folder = Path(shutil.copytree(encoders["image"], tmp_path / "clip_as_text"))
        for f in Path(encoders["text"]).glob("tokenizer*"):
            shutil.copy(f, folder / f.name)
    elif case == "decoy weights":  # the text encoder's config and tokenizer, CLIP's weights
        shutil.copy(next(Path(encoders["image"]).glob("*.safetensors")), weights)
    elif case == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif case == "flipped header":
        data = bytearray(weights.read_bytes())
        data[10] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif case == "pickle":
        weights.write_bytes(pickle.dumps({"x": 1}))
    elif case == "absurd config":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "base_dim": 1 << 20}))
    return role, folder


CASES = {"wrong folder": "parameters", "decoy weights": "lack", "truncated": "not a readable safetensors file",
         "flipped header": "not a readable safetensors file", "pickle": "not a readable safetensors file",
         "absurd config": "parameters"}


@pytest.mark.parametrize("case", list(CASES))
def test_an_encoder_folder_that_does_not_load_is_one_line(encoders, tmp_path, case):  # noqa: F811
    role, folder = _broken(encoders, tmp_path, case)
    kw = {"vae": None, "text": None, "image": None, "text" if role == "text" else "vae": folder}
    with pytest.raises(ConfigError) as e:
        Encoders(kw["vae"], kw["text"], None, "float32", "cpu")
    message = str(e.value)
    assert "\n" not in message and str(folder) in message and CASES[case] in message, message


def test_the_intact_folders_load(encoders):  # noqa: F811
    enc = Encoders(Path(encoders["wan2.1"]), Path(encoders["text"]), Path(encoders["image"]), "float32", "cpu")
    assert enc.vae is not None and enc.text is not None and enc.image is not None


def test_the_cli_names_the_folder_and_writes_nothing(encoders, source, tmp_path, capsys):  # noqa: F811
    _, folder = _broken(encoders, tmp_path, "pickle")
    out = tmp_path / "out"
    assert main(["encode", str(source), str(out), "--vae", str(folder), "--clip", "5", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(folder) in err, err
    assert main(["encode", str(source), str(tmp_path / "g"), "--vae", str(encoders["wan2.1"]), "--clip", "5",
                 "--size", "100000x100000", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--size" in err and "beyond 8192" in err, err
