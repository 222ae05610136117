"""Never a silent tokenizer (issue 35, item 1).

- `model.init_from` takes the tokenizer its folder carries (an export's tokenizer/) unless the run
  names one: a run trained with its own SentencePiece model is exported, a second run starts from
  the export without naming a tokenizer, and its export carries that model byte for byte (not the
  tiny preset's own); summary.json and the run's first lines say which and from where.
- A real-width checkpoint (PaliGemma's 257,152-row embedding) carrying no tokenizer is refused in
  one line naming the file to pass, unless `model.tokenizer = "builtin"` opts in; checked on a
  header-only full-size checkpoint (a sparse file: no tensor is ever read).
- The shipped tiny SentencePiece model is what tools/make_tiny_tokenizer.py makes, converts to a
  Hugging Face tokenizer exactly (Gemma's normalisation), and the tiny preset uses it.
"""
from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import torch

from trainkit.errors import ConfigError
from trainkit_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit_harness import TINY

spm = pytest.importorskip("sentencepiece")

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "make_tiny_tokenizer.py"
FINETUNE = ROOT / "trainkit" / "configs" / "pi05_finetune.toml"


def _tool():
    spec = importlib.util.spec_from_file_location("make_tiny_tokenizer", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def own_tokenizer(path: Path) -> Path:
    """A SentencePiece model other than the shipped one (other text, other size), Gemma-normalised."""
    text = [f"Task: {t} {i}, State: {i % 256};\nAction: " for i in range(200)
            for t in ("grasp the mug", "slide the door", "press the button")]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=300, model_type="bpe",
                                   character_coverage=1.0, byte_fallback=True, add_dummy_prefix=False,
                                   normalization_rule_name="identity", remove_extra_whitespaces=False,
                                   split_digits=True, pad_id=0, eos_id=1, bos_id=2, unk_id=3, bos_piece="<bos>",
                                   eos_piece="<eos>", num_threads=1, minloglevel=2)
    path.write_bytes(buf.getvalue())
    return path


def cli(*args: str) -> int:
    from trainkit.cli import main

    return main(list(args))


def train(shards: Path, out: Path, *sets: str) -> Path:
    base = (f"data.shards={shards}", f"output.dir={out}", "train.steps=2", "output.checkpoint_every=2",
            "parallel.fsdp=none", "parallel.ac_stride={}", "output.progress=false", "data.num_workers=0", *sets)
    assert cli("run", str(TINY), *[a for s in base for a in ("--set", s)]) == 0
    return out


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_shipped_tiny_tokenizer_is_the_tools_and_converts_exactly():
    from trainkit.models.pi05.config import tiny
    from trainkit.models.pi05.tokenizer import TINY_MODEL
    from trainkit.weights.hf_tokenizer import tokenizer_files

    tool = _tool()
    if spm.__version__ == tool.MADE_WITH:  # reproducible by the script, byte for byte, with its sentencepiece
        assert tool.train() == TINY_MODEL.read_bytes()
    assert TINY_MODEL.stat().st_size < 64_000
    out, problem = tokenizer_files(TINY_MODEL)
    assert problem is None and set(out) >= {"tokenizer.json", "tokenizer.model"}
    sp = spm.SentencePieceProcessor(model_file=str(TINY_MODEL))
    assert sp.get_piece_size() <= tiny().vocab and sp.piece_to_id("<0xE2>") > 3  # byte fallback
    assert tiny().tokenizer == "tiny" and tiny().tokenizer_file() == TINY_MODEL


def test_export_init_from_export_keeps_the_tokenizer_byte_for_byte(shards_rgb, tmp_path, capsys):  # noqa: F811
    mine = own_tokenizer(tmp_path / "mine.model")
    first = train(shards_rgb, tmp_path / "run1", f"model.tokenizer={mine}")
    assert json.loads((first / "summary.json").read_text())["tokenizer"] == {
        "name": str(mine), "from": "model.tokenizer as set"}
    assert cli("export", str(first), str(tmp_path / "export1"), "--format", "lerobot") == 0
    assert (tmp_path / "export1" / "tokenizer" / "tokenizer.model").read_bytes() == mine.read_bytes()
    first_tokenizer = Path(shutil.copytree(tmp_path / "export1" / "tokenizer", tmp_path / "export1_tokenizer"))
    capsys.readouterr()
    second = train(shards_rgb, tmp_path / "run2", f"model.init_from={tmp_path / 'export1'}")
    out = capsys.readouterr().out.splitlines()
    kept = (second / "tokenizer" / "tokenizer.model").resolve()  # the run's own copy: init_from may move
    assert kept.read_bytes() == mine.read_bytes()
    assert out[0] == f"trainkit: prompt tokenizer {kept} (model.init_from's tokenizer/tokenizer.model)", out
    assert json.loads((second / "summary.json").read_text())["tokenizer"] == {
        "name": str(kept), "from": "model.init_from's tokenizer/tokenizer.model"}
    shutil.rmtree(tmp_path / "export1" / "tokenizer")  # moved away: the run's export does not need it
    assert cli("export", str(second), str(tmp_path / "export2"), "--format", "lerobot") == 0
    one, two = files(first_tokenizer), files(tmp_path / "export2" / "tokenizer")
    assert one == two and two["tokenizer.model"] == mine.read_bytes()
    readme = (tmp_path / "export2" / "README.txt").read_text()
    assert "built-in" not in readme and "tokenizer/" in readme


def test_a_tiny_run_says_its_presets_tokenizer_and_builtin_is_said_too(shards_rgb, tmp_path, capsys):  # noqa: F811
    run = train(shards_rgb, tmp_path / "tiny")
    assert json.loads((run / "summary.json").read_text())["tokenizer"] == {"name": "tiny", "from": "the tiny preset's"}
    capsys.readouterr()
    run = train(shards_rgb, tmp_path / "builtin", "model.tokenizer=builtin")
    first = capsys.readouterr().out.splitlines()[0]  # the run's first line (stderr: notes and refusals)
    assert first.startswith("trainkit: prompt tokenizer builtin (model.tokenizer as set): trainkit's own"), first
    assert cli("export", str(run), str(tmp_path / "out"), "--format", "lerobot") == 0
    assert not (tmp_path / "out" / "tokenizer").exists()
    readme = (tmp_path / "out" / "README.txt").read_text()
    assert "THIS/tokenizer" not in readme and "does not hold" in readme, readme  # only files the export has


# --- a full-size checkpoint, header only ---------------------------------------------------------------
@pytest.fixture(scope="module")
def full_header(tmp_path_factory) -> Path:
    """A LeRobot-format folder at Pi0.5's full shapes whose model.safetensors is a header and a sparse
    data section (bf16): every check on the header passes, and no tensor data exists to read."""
    from trainkit.models import build_model
    from trainkit.models.pi05.weights import export_tensors, policy_config

    with torch.device("meta"):
        model = build_model("pi05", "full", {})
    shapes = {k: list(v.shape) for k, v in export_tensors(model.cfg, model.state_dict(), "lerobot").items()}
    header, offset = {}, 0
    for key in sorted(shapes):
        n = 2 * int(torch.Size(shapes[key]).numel())
        header[key] = {"dtype": "BF16", "shape": shapes[key], "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    folder = tmp_path_factory.mktemp("full") / "pi05_full"
    folder.mkdir()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
    os.truncate(folder / "model.safetensors", 8 + len(raw) + offset)  # sparse: no disk used
    config = policy_config(model.cfg, {"cameras": ["observation.images.top"], "state_dim": 8, "action_dim": 7})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _finetune(folder: Path, *sets: str):
    from trainkit.config import load_config
    from trainkit.weights.shape import with_weights_shape

    cfg = load_config(FINETUNE, [f"model.init_from={folder}", "data.shards=unused", *sets])
    return cfg, with_weights_shape(cfg)


def test_a_full_width_checkpoint_without_a_tokenizer_is_refused_unless_builtin(full_header):
    with pytest.raises(ConfigError, match=r"model.tokenizer: model.init_from .* carries no tokenizer .* 257152-row "
                                          r"embedding is PaliGemma's: pass the tokenizer.model .*model.tokenizer=builtin"):
        _finetune(full_header)
    from trainkit.models import build_config
    from trainkit.weights.tokenizer_source import tokenizer_source

    cfg, (cfg2, fixed) = _finetune(full_header, "model.tokenizer=builtin")
    assert "tokenizer" not in fixed and fixed["vocab"][0] == 257_152
    model_cfg = build_config("pi05", cfg2.model.preset, cfg2.model.overrides)
    assert tokenizer_source(cfg2, model_cfg, fixed) == {"name": "builtin", "from": "model.tokenizer as set"}


def test_a_full_width_checkpoint_carrying_a_tokenizer_uses_it(full_header, tmp_path):
    from trainkit.models.pi05.tokenizer import TINY_MODEL

    folder = tmp_path / "with_tokenizer"
    folder.mkdir()
    for name in ("model.safetensors", "config.json"):  # hard links: a symlink out of the folder is refused
        os.link(full_header / name, folder / name)
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "tokenizer.model").write_bytes(TINY_MODEL.read_bytes())
    _, (_, fixed) = _finetune(folder)
    assert fixed["tokenizer"] == (str((folder / "tokenizer" / "tokenizer.model").resolve()),
                                  "model.init_from's tokenizer/tokenizer.model")
    _, (_, fixed) = _finetune(folder, f"model.tokenizer={TINY_MODEL}")  # one the run names wins
    assert "tokenizer" not in fixed


def test_the_refusal_is_one_line_from_the_cli(full_header, shards_rgb, tmp_path, capsys):  # noqa: F811
    code = cli("run", str(FINETUNE), "--set", f"model.init_from={full_header}", "--set", f"data.shards={shards_rgb}",
               "--set", f"output.dir={tmp_path / 'run'}")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--set model.tokenizer=PATH/tokenizer.model" in err, err
