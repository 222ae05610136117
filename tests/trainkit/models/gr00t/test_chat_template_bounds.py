"""GR00T chat templates from a tokenizer folder: rendered once per number of views, bounded in time,
memory and output, and refused in one line naming the template's file when they run away, fail,
lay out no image runs (the model would train blind) or make a prompt beyond the model's text budget.
Positive control: the builtin template written to a folder renders exactly as the builtin."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.errors import TokenizerError
from trainkit.models.gr00t.batches import chat_tokenizer
from trainkit.models.gr00t.config import tiny
from trainkit.models.gr00t.lerobot_policy import processor_folder

ROOT = Path(__file__).resolve().parents[4]


def _folder(tmp_path: Path, template: str | None) -> Path:
    """The builtin tokenizer's files, its chat template replaced by `template` (None: kept)."""
    folder = tmp_path / "tok"
    folder.mkdir(exist_ok=True)
    for name, data in processor_folder(tiny()).items():
        (folder / name).write_bytes(data)
    if template is not None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return folder


NESTED = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
SCRIPT = """
import sys, time
from dataclasses import replace
from trainkit.models.gr00t.batches import chat_tokenizer
from trainkit.models.gr00t.config import tiny
try:
    import trainkit.models.gr00t.chat_render as r
    r.RENDER_SECONDS = 2.0
except ImportError:
    pass
t0 = time.monotonic()
try:
    chat_tokenizer(replace(tiny(), tokenizer=sys.argv[1])).prompt("pick", 2)
    print("rendered")
except ValueError as e:
    print("refused", str(e))
"""


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def test_a_runaway_template_is_stopped_in_time_and_named(tmp_path):
    """Two nested range(100000) loops (each within the sandbox's limit): the render is stopped
    after its time limit and refused in one line naming tokenizer_config.json; nothing is left running."""
    folder = _folder(tmp_path, NESTED)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(folder)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # its whole session: the script and any child it started
        proc.communicate()
        pytest.fail("the template's render did not return within 60 s")
    assert time.monotonic() - t0 < 60
    assert out.decode().strip() == (f"refused {folder}/tokenizer_config.json: the chat template did not finish "
                                    "rendering within 2 s (stopped)"), err.decode()[-2000:]
    assert not _children(proc.pid)


def test_the_render_child_is_killed_at_its_limit(tmp_path, monkeypatch):
    import trainkit.models.gr00t.chat_render as r

    monkeypatch.setattr(r, "RENDER_SECONDS", 1.0)
    tok = chat_tokenizer(replace(tiny(), tokenizer=str(_folder(tmp_path, NESTED))))
    before = set(_children(os.getpid()))  # in a whole-suite process, earlier tests' children may live on
    with pytest.raises(TokenizerError, match="did not finish rendering within 1 s"):
        tok.prepare([1, 2, 3])
    assert not set(_children(os.getpid())) - before  # the render child is gone, killed and reaped


BROKEN = {  # template -> what the one line says after "the chat template "
    "{{ messages.append(1) }}": "SecurityError",
    "{{ messages[0].content[0].nothing.deeper }}": "UndefinedError",
    "{% include 'other.jinja' %}": "TypeError",
    "{% import 'other.jinja' as x %}": "TypeError",
    "{% for i in range(10**12) %}{% endfor %}": "OverflowError",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}": "RecursionError",
    "{{ 'x' * 10**10 }}": "MemoryError",
    "{{ raise_exception('no tools here') }}": "raise_exception: no tools here",
    "{% for %}": "does not compile",
    "{% for i in range(100000) %}{{ 'abcdefghij' * 10 }}{% endfor %}": "renders more than",
}


@pytest.mark.parametrize("template", list(BROKEN))
def test_a_failing_template_is_one_line_naming_its_file(tmp_path, template):
    folder = _folder(tmp_path, template)
    with pytest.raises(TokenizerError) as e:
        chat_tokenizer(replace(tiny(), tokenizer=str(folder))).prepare([1, 2])
    message = str(e.value)
    assert message.startswith(f"{folder}/tokenizer_config.json: the chat template ") and "\n" not in message
    assert BROKEN[template] in message


BLIND = {  # a template that lays out no (or the wrong) image runs
    "text only": "<|im_start|>user\n{{ messages[0]['content'][-1]['text'] }}<|im_end|>\n",
    "content as text": "<|im_start|>user\n{{ messages[0]['content'] }}<|im_end|>\n",
    "two pads a view": "{% for p in messages[0].content %}{% if p.type == 'image' %}<|vision_start|><|image_pad|>"
                       "<|image_pad|><|vision_end|>{% else %}{{ p.text }}{% endif %}{% endfor %}",
    "one run for all": "<|vision_start|><|image_pad|><|vision_end|>{{ messages[0].content[-1].text }}",
}


@pytest.mark.parametrize("name", list(BLIND))
def test_a_template_without_one_image_run_per_view_is_refused(tmp_path, name):
    folder = _folder(tmp_path, BLIND[name])
    tok = chat_tokenizer(replace(tiny(), tokenizer=str(folder)))
    with pytest.raises(TokenizerError, match=rf"^{folder}/tokenizer_config.json: the chat template lays out \d+ "
                                             r".* for 2 views, not one per view"):
        tok.encode(["pick"], views=2)


def test_a_template_that_drops_or_repeats_the_task_is_refused(tmp_path):
    run = "{% for p in messages[0].content %}{% if p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>" \
          "{% endif %}{% endfor %}"
    for text, times in (("", 0), ("{{ messages[0].content[-1].text * 2 }}", 2)):
        tok = chat_tokenizer(replace(tiny(), tokenizer=str(_folder(tmp_path, run + text))))
        with pytest.raises(TokenizerError, match=f"places the task text {times} times"):
            tok.prepare([1])


def test_a_template_longer_than_the_text_budget_is_refused(tmp_path):
    """tiny's text_len is 64 tokens: a template adding 100 words of its own is refused before any
    prompt is encoded; the same template fits a model of a larger text_len."""
    long = BLIND["two pads a view"].replace("<|image_pad|><|image_pad|>", "<|image_pad|>") + " word" * 100
    folder = str(_folder(tmp_path, long))
    with pytest.raises(TokenizerError, match=r"own text is \d+ tokens .* beyond the model's text_len 64$"):
        chat_tokenizer(replace(tiny(), tokenizer=folder)).prepare([1])
    chat_tokenizer(replace(tiny(), tokenizer=folder, text_len=1000)).prepare([1])


def test_the_builtin_template_from_a_folder_renders_as_the_builtin(tmp_path):
    """Positive control: the same template in a folder (child process) and builtin (in process)."""
    folder = chat_tokenizer(replace(tiny(), tokenizer=str(_folder(tmp_path, None))))
    builtin = chat_tokenizer(tiny())
    for views in (1, 2, 3):
        assert folder.prompt("Pick the cube!", views) == builtin.prompt("Pick the cube!", views)
        assert folder.prompt("Pick the cube!", views).count("<|image_pad|>") == views * tiny().tokens_per_image


def test_a_blind_template_is_refused_at_launch(shards_rgb, tmp_path, capsys):  # noqa: F811
    """`trainkit run gr00t_tiny.toml --set model.tokenizer=TOK`: exit 2, one line, no step run."""
    from trainkit.cli import main

    folder = _folder(tmp_path, BLIND["text only"])
    out = tmp_path / "out"
    sets = ("output.progress=false", "data.num_workers=0", f"data.shards={shards_rgb}", f"output.dir={out}",
            f"model.tokenizer={folder}", "train.steps=2", "parallel.fsdp=none")
    code = main(["run", str(ROOT / "trainkit/configs/gr00t_tiny.toml"), *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{folder}/tokenizer_config.json: the chat template lays out 0" in err
    assert not (out / "metrics.jsonl").exists() or "step" not in (out / "metrics.jsonl").read_text()


def test_a_blind_template_in_an_init_from_folder_s_tokenizer_is_refused(tmp_path):
    """model.init_from's `tokenizer/` becomes model.tokenizer: the same check, naming that file."""
    from test_init_from_bad_shape import _checkpoint

    from trainkit.config import load_config
    from trainkit.models import build_config
    from trainkit.weights.shape import with_weights_shape

    folder = _checkpoint(tmp_path, "gr00t")
    tok = _folder(folder, BLIND["text only"])
    tok.rename(folder / "tokenizer")
    cfg = load_config(ROOT / "trainkit/configs/gr00t_tiny.toml",
                      [f"model.init_from={folder}", "data.shards=/d", "output.dir=/o"])
    cfg, _ = with_weights_shape(cfg)
    model_cfg = build_config("gr00t", cfg.model.preset, cfg.model.overrides)
    assert model_cfg.tokenizer == str(folder / "tokenizer")
    with pytest.raises(TokenizerError, match=rf"^{folder}/tokenizer/tokenizer_config.json: the chat template lays "
                                             "out 0 "):
        chat_tokenizer(model_cfg).prepare([1, 2, 3])
