"""`trainkit export --format lerobot` is a policy LeRobot serves (issue 26, item 4).

A tiny Pi0.5 run trained with a SentencePiece tokenizer (`model.tokenizer`; trained here with
Gemma's normalisation, as no PaliGemma file can be downloaded) is exported; LeRobot 0.6.1 in its own
venv (tools/lerobot_oracle/pi05_serve_oracle.py; skipped without it) then builds the policy and
its processors from the export folder alone and serves a raw observation: uint8 camera frames as a
robot gives them, a state vector, a task string, one camera left out. The oracle is trainkit's own
path for the same observation: the run's loader preset, normaliser and batch adapter (prompt
tokens), the model's flow velocity integrated from the same noise in 10 Euler steps (t from 1 to
0, as LeRobot does), unnormalised with the run's statistics. LeRobot's action chunk must equal it
to the parity test's tolerance, and its prompt tokens must be trainkit's. Positive controls: the
same export with the state's q01/q99 swapped, or the tokenizer's max_length cut below the prompt,
fails that comparison. LeRobot's own `make_pi05_pre_post_processors` + `save_pretrained` for the
export's config writes the reference the processor files are compared with. A run on a mixture
(another robot first, this dataset second), exported for this dataset's source (`--source`), is
served too: its normalised state is the mixture loader's for that source (`Normaliser.from_sources`).

Without the venv: what the export writes beside the weights (README.txt, the tokenizer folder,
openpi's norm_stats.json) and the notes and errors when serving cannot be faithful.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from trainkit.models import family
from loader_fixtures import shards_b  # noqa: F401 - fixture (another robot, for a mixture)
from trainkit_fixtures import shards_rgb  # noqa: F401 - fixture
from trainkit_harness import TINY

spm = pytest.importorskip("sentencepiece")

ROOT = Path(__file__).resolve().parents[3]
LEROBOT_PY = Path(os.environ.get("LEROBOT_VENV", "/tmp/lerobot-venv")) / "bin" / "python"
ORACLE = ROOT / "tools" / "lerobot_oracle" / "pi05_serve_oracle.py"
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason=f"no lerobot venv at {LEROBOT_PY.parents[1]} (make lerobot-oracle)")
TOLERANCE = 2e-5  # tests/trainkit/models/pi05/test_pi05_lerobot_parity.py's, on the velocity
CAMERAS = ("observation.images.top", "observation.images.wrist")  # the side camera (blank in the data) left out
TASKS = ["pick up the red cube", "open the top drawer", "put the bowl on the plate and close the drawer"]

pytestmark = pytest.mark.timeout(300)


def train_sentencepiece(path: Path, gemma: bool = True) -> Path:
    """A small BPE SentencePiece model; `gemma`: normalised as PaliGemma's is (no dummy prefix,
    identity rules, whitespace kept, byte fallback, digits split), else sentencepiece's defaults."""
    rng = np.random.default_rng(0)
    text = [f"Task: {t}, State: {' '.join(map(str, rng.integers(0, 256, 8)))};\nAction: " for t in TASKS * 30]
    style = {"add_dummy_prefix": False, "normalization_rule_name": "identity", "remove_extra_whitespaces": False,
             "byte_fallback": True, "split_digits": True, "allow_whitespace_only_pieces": True} if gemma else {}
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=400 if gemma else 120,
                                   model_type="bpe", character_coverage=1.0, bos_id=2, eos_id=1, pad_id=0, unk_id=3,
                                   bos_piece="<bos>", eos_piece="<eos>", hard_vocab_limit=False, **style)
    path.write_bytes(buf.getvalue())
    return path


def train_run(shards: Path, out: Path, *sets: str) -> Path:
    from trainkit.cli import main

    base = (f"data.shards={shards}", f"output.dir={out}", "model.heads_q=8", "train.steps=2",
            "output.checkpoint_every=2", "parallel.fsdp=none", "parallel.ac_stride={}", "output.progress=false",
            "data.num_workers=0", *sets)
    assert main(["run", str(TINY), *[a for s in base for a in ("--set", s)]]) == 0
    return out


def export(run: Path, out: Path, *extra: str, fmt: str = "lerobot") -> int:
    from trainkit.cli import main

    return main(["export", str(run), str(out), "--format", fmt, *extra])


@pytest.fixture(scope="module")
def served(tmp_path_factory, shards_rgb):  # noqa: F811
    """(root, run, export): a tiny run trained with a Gemma-style SentencePiece tokenizer, exported."""
    root = tmp_path_factory.mktemp("serving")
    tokenizer = train_sentencepiece(root / "tokenizer.model")
    run = train_run(shards_rgb, root / "run", f"model.tokenizer={tokenizer}")
    assert export(run, root / "export") == 0
    return root, run, root / "export"


def observation(shards: Path) -> dict[str, np.ndarray]:
    """A raw observation as a robot gives it (uint8 HWC frames at the model's 16 px, a state inside
    the data's range, one of the dataset's tasks), the flow noise, and the dataset's statistics."""
    from datakit.shards.index import load_index

    index = load_index(shards)
    rng = np.random.default_rng(7)
    lo, hi = np.array(index.stats["state"]["min"]), np.array(index.stats["state"]["max"])
    obs = {f"image/{cam}": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for cam in CAMERAS}
    obs["state"] = (lo + (hi - lo) * rng.uniform(0.1, 0.9, lo.shape)).astype(np.float32)
    obs["task"] = np.array(index.tasks[0])
    obs["noise"] = rng.normal(size=(1, 50, 32)).astype(np.float32)
    for part, key in (("state", "observation.state"), ("action", "action")):
        for stat, values in index.stats[part].items():
            obs[f"stats/{key}.{stat}"] = np.asarray(values, dtype=np.float32)
    return obs


def sample(model: torch.nn.Module, batch, noise: torch.Tensor, steps: int = 10) -> torch.Tensor:
    """Pi0.5's sampler: x = noise at t = 1, then x <- x + dt v(x, t), dt = -1/steps, t_i = 1 + i dt
    (LeRobot 0.6.1's euler_integrate). trainkit's `sample_actions` where the branch has it; else
    the velocity at x itself (actions = noise = x give x_t = x)."""
    from dataclasses import replace

    from trainkit.models.pi05 import model as pi05_model

    own = getattr(pi05_model, "sample_actions", None)
    if own is not None:
        return own(model, batch, noise, steps)
    dt, x = -1.0 / steps, noise.float()
    with torch.no_grad():
        for i in range(steps):
            t = torch.full((x.shape[0],), 1.0 + i * dt, dtype=torch.float32)
            x = x + dt * model.velocity(replace(batch, actions=x, noise=x, time=t))
    return x


def trainkit_serves(run: Path, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """trainkit's own action chunk for `obs`: the run's loader preset, normaliser and batch adapter,
    the trained model, the same noise; unnormalised with the run's statistics."""
    from datakit.loader import Normaliser
    from trainkit.data import loader_settings, read_run_shards
    from trainkit.weights.export import load_run_model

    model, cfg, _ = load_run_model(run)
    fam = family("pi05")
    shards = read_run_shards(cfg.data, fam.max_slots(model.cfg))
    index = shards.index
    loader = fam.loader_config(model.cfg, index, **loader_settings(
        cfg.data, shards.slots, seed=0, rank=0, world_size=1, micro_batch=1, image_dtype=torch.float32,
        pin_memory=False))
    present = [cam in CAMERAS for cam in shards.slots]
    frames = [torch.from_numpy(obs[f"image/{cam}"]) if on else torch.zeros((16, 16, 3), dtype=torch.uint8)
              for cam, on in zip(shards.slots, present)]
    hb = {"images": torch.stack(frames)[None, :, None], "image_mask": torch.tensor([present]),
          "state": torch.from_numpy(obs["state"])[None, None], "task_index": torch.tensor([0]),
          "action": torch.zeros((1, model.cfg.horizon, len(index.action_names))), "row": torch.tensor([0])}
    normaliser = Normaliser.from_index(index, loader)
    adapter = fam.batches(model.cfg, index, normaliser)
    assert adapter.tasks[0] == str(obs["task"])
    hb = adapter.extras(hb, torch.Generator().manual_seed(0))
    batch = adapter.model_batch({**hb, **normaliser(hb)})
    x = sample(model, batch, torch.from_numpy(obs["noise"]))[..., :len(index.action_names)]
    scale, bias = normaliser.action_affine
    return {"actions": ((x - bias) / scale).numpy(), "tokens": batch.tokens.numpy(),
            "token_mask": batch.token_mask.numpy(), "state": normaliser(hb)["state"][:, -1].numpy()}


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def _swap_state_quantiles(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    pipe = json.loads((folder / "policy_preprocessor.json").read_text())
    state_file = folder / next(s["state_file"] for s in pipe["steps"] if s["registry_name"] == "normalizer_processor")
    t = load_file(str(state_file))
    t["observation.state.q01"], t["observation.state.q99"] = t["observation.state.q99"], t["observation.state.q01"]
    save_file(t, str(state_file))


def _cut_tokenizer(folder: Path, max_length: int) -> None:
    path = folder / "policy_preprocessor.json"
    pipe = json.loads(path.read_text())
    next(s for s in pipe["steps"] if s["registry_name"] == "tokenizer_processor")["config"]["max_length"] = max_length
    path.write_text(json.dumps(pipe, indent=2))


def mixture_state(served, shards_rgb, shards_b, obs: dict[str, np.ndarray]) -> tuple[Path, np.ndarray]:  # noqa: F811
    """(the export for source "sim" of a run on shards_b ("other") + shards_rgb ("sim"), the mixture
    loader's normalised `obs["state"]` for that source: its row of `Normaliser.from_sources`)."""
    from datakit.loader import LoaderConfig, Normaliser
    from datakit.shards.index import load_index

    root, run, _ = served
    sources = (f'data.sources=[{{shards = "{shards_b}", weight = 0.5, name = "other"}}, '
               f'{{shards = "{shards_rgb}", weight = 0.5, name = "sim"}}]')
    mixed = train_run(shards_rgb, root / "mixed_run", f"model.tokenizer={root / 'tokenizer.model'}", sources)
    assert export(mixed, root / "mixed_sim", "--source", "sim") == 0
    norm = Normaliser.from_sources([load_index(shards_b), load_index(shards_rgb)], LoaderConfig(norm="quantile"),
                                   state_dim=6, action_dim=6)
    state = norm.vector(torch.from_numpy(obs["state"])[None, None], norm.state_affine, torch.tensor([1]))
    return root / "mixed_sim", state[:, -1].numpy()


@pytest.fixture(scope="module")
def lerobot(served, shards_rgb, shards_b):  # noqa: F811
    """(LeRobot's outputs for [the export, q01/q99 swapped, tokenizer cut, a mixture's export for
    this dataset], trainkit's, the reference folder, the prompts and LeRobot's ids of them, the
    mixture loader's normalised state)."""
    root, run, exp = served
    obs = observation(shards_rgb)
    ours = trainkit_serves(run, obs)
    mixed, mixed_state = mixture_state(served, shards_rgb, shards_b, obs)
    swapped, cut = shutil.copytree(exp, root / "swapped_q"), shutil.copytree(exp, root / "cut")
    _swap_state_quantiles(swapped)
    _cut_tokenizer(cut, int(ours["token_mask"].sum()) - 4)
    np.savez(root / "obs.npz", **obs)
    prompts = [f"Task: {t}, State: 1 22 255;\nAction: " for t in TASKS] + ["naïve  tâche ✓ 日本", "  lead", "x" * 300]
    (root / "prompts.json").write_text(json.dumps(prompts))
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), str(root / "obs.npz"), str(root / "lerobot.npz"),
                           str(exp), str(swapped), str(cut), str(mixed), "--reference", str(root / "reference"),
                           "--prompts", str(root / "prompts.json")], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    ids = json.loads((root / "lerobot.npz.prompts.json").read_text())
    return dict(np.load(root / "lerobot.npz")), ours, root / "reference", prompts, ids, mixed_state


@needs_lerobot
def test_lerobot_serves_the_export_as_trainkit_acts(lerobot):
    theirs, ours, *_ = lerobot
    assert theirs["0/tokens"][theirs["0/token_mask"]].tolist() == ours["tokens"][ours["token_mask"]].tolist()
    assert np.allclose(theirs["0/state"], ours["state"], rtol=0, atol=1e-6)
    assert theirs["0/actions"].shape == ours["actions"].shape == (1, 50, 6)
    assert rel(theirs["0/actions"], ours["actions"]) < TOLERANCE


@needs_lerobot
@pytest.mark.parametrize("fault", [1, 2], ids=["state_q01_q99_swapped", "tokenizer_max_length_cut"])
def test_a_wrong_statistic_or_tokenizer_length_fails_the_comparison(lerobot, fault):
    theirs, ours, *_ = lerobot
    tokens = theirs[f"{fault}/tokens"][theirs[f"{fault}/token_mask"]].tolist()
    assert tokens != ours["tokens"][ours["token_mask"]].tolist()
    assert rel(theirs[f"{fault}/actions"], ours["actions"]) > 10 * TOLERANCE  # the comparison above fails


@needs_lerobot
def test_lerobot_normalises_a_mixture_sources_state_as_the_mixture_loader_did(lerobot):
    """The mixture's export for its second source: LeRobot's normalised state is that source's row
    of the loader's tables (the first source's, 4 channels wide, would not even fit)."""
    theirs, ours, *_, mixed_state = lerobot
    assert theirs["3/state"].shape == mixed_state.shape == (1, 6)
    assert np.allclose(theirs["3/state"], mixed_state, rtol=0, atol=1e-6)
    assert np.abs(theirs["1/state"] - mixed_state).max() > 1e-2  # the swapped statistics' state: the check can fail
    assert theirs["3/actions"].shape == (1, 50, 6)


@needs_lerobot
def test_the_processor_files_are_the_ones_lerobot_writes(lerobot, served):
    """LeRobot's own factory for the export's config and the run's statistics, saved by LeRobot:
    the same steps and configs (the tokenizer named by its path here, by its Hub name there) and
    the same statistics in the state files."""
    from safetensors.torch import load_file

    _, _, exp = served
    reference = lerobot[2]
    for name in ("policy_preprocessor", "policy_postprocessor"):
        ours, theirs = (json.loads((f / f"{name}.json").read_text()) for f in (exp, reference))
        for steps in (ours["steps"], theirs["steps"]):
            for step in steps:
                if step["registry_name"] == "tokenizer_processor":
                    step["config"]["tokenizer_name"] = "(compared below)"
        assert ours == theirs, name
        for step in ours["steps"]:
            if "state_file" in step:
                a, b = (load_file(str(f / step["state_file"])) for f in (exp, reference))
                assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), step["state_file"]
    pipe = json.loads((exp / "policy_preprocessor.json").read_text())
    step = next(s for s in pipe["steps"] if s["registry_name"] == "tokenizer_processor")
    assert step["config"]["tokenizer_name"] == str(exp / "tokenizer")


@needs_lerobot
def test_the_exported_tokenizer_tokenizes_as_sentencepiece(lerobot, served):
    """transformers' AutoTokenizer on OUT/tokenizer (offline) gives sentencepiece's ids, BOS first,
    for prompts with non-ASCII text (byte fallback), double and leading spaces, and a long one."""
    root, _, _ = served
    prompts, ids = lerobot[3], lerobot[4]
    sp = spm.SentencePieceProcessor(model_file=str(root / "tokenizer.model"))
    assert ids == [sp.encode(p, add_bos=True) for p in prompts]


# --- without LeRobot: what the export writes, and says -----------------------------------------

def test_the_export_carries_its_tokenizer_pipeline_and_readme(served):
    from trainkit.weights.publish import MARKER

    root, _, exp = served
    marker = json.loads((exp / MARKER).read_text())
    for name in ("policy_preprocessor.json", "policy_postprocessor.json", "README.txt", "tokenizer/tokenizer.json",
                 "tokenizer/tokenizer_config.json", "tokenizer/tokenizer.model"):
        assert name in marker["files"], name
    assert (exp / "tokenizer" / "tokenizer.model").read_bytes() == (root / "tokenizer.model").read_bytes()
    pre = json.loads((exp / "policy_preprocessor.json").read_text())
    assert [s["registry_name"] for s in pre["steps"]] == [
        "rename_observations_processor", "to_batch_processor", "relative_actions_processor", "normalizer_processor",
        "pi05_prepare_state_tokenizer_processor_step", "tokenizer_processor", "device_processor"]
    tok = pre["steps"][5]["config"]
    assert (tok["max_length"], tok["padding_side"], tok["padding"]) == (48, "right", "max_length")
    readme = (exp / "README.txt").read_text()
    assert str(exp / "tokenizer") in readme and "make_pre_post_processors" in readme


def test_tokenizer_name_names_another_tokenizer(served, tmp_path):
    _, run, _ = served
    assert export(run, tmp_path / "hub", "--tokenizer-name", "google/paligemma-3b-pt-224") == 0
    pre = json.loads((tmp_path / "hub" / "policy_preprocessor.json").read_text())
    assert pre["steps"][5]["config"]["tokenizer_name"] == "google/paligemma-3b-pt-224"


def test_openpi_gets_its_norm_stats_and_what_else_it_needs(served, shards_rgb, tmp_path):  # noqa: F811
    from datakit.shards.index import load_index

    _, run, _ = served
    assert export(run, tmp_path / "openpi", fmt="openpi") == 0
    body = json.loads((tmp_path / "openpi" / "assets" / "trainkit" / "norm_stats.json").read_text())["norm_stats"]
    stats = load_index(shards_rgb).stats
    for ours, theirs in (("state", "state"), ("action", "actions")):
        assert {k: body[theirs][k] for k in ("mean", "std", "q01", "q99")} == \
            {k: stats[ours][k] for k in ("mean", "std", "q01", "q99")}
    readme = (tmp_path / "openpi" / "README.txt").read_text()
    for needed in ("asset_id", "Pi0Config(pi05=True", "max_token_len=48", "paligemma_tokenizer.model",
                   "use_quantile_norm=True"):
        assert needed in readme, needed
    assert (tmp_path / "openpi" / "tokenizer" / "tokenizer.model").is_file()


def test_a_run_with_the_builtin_tokenizer_is_exported_with_a_note(shards_rgb, tmp_path, capsys):  # noqa: F811
    run = train_run(shards_rgb, tmp_path / "run", "model.tokenizer=builtin")
    capsys.readouterr()
    assert export(run, tmp_path / "out") == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("trainkit: note:")]
    assert len(notes) == 1 and "built-in prompt tokenizer" in notes[0], notes
    pre = json.loads((tmp_path / "out" / "policy_preprocessor.json").read_text())
    assert pre["steps"][5]["config"]["tokenizer_name"] == "google/paligemma-3b-pt-224"
    assert not (tmp_path / "out" / "tokenizer").exists()
    assert "built-in prompt tokenizer" in (tmp_path / "out" / "README.txt").read_text()


def test_a_tokenizer_that_does_not_convert_is_said_and_a_missing_one_is_one_line(shards_rgb, tmp_path,  # noqa: F811
                                                                                 capsys):
    tokenizer = train_sentencepiece(tmp_path / "plain.model", gemma=False)
    run = train_run(shards_rgb, tmp_path / "run", f"model.tokenizer={tokenizer}")
    capsys.readouterr()
    assert export(run, tmp_path / "out") == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("trainkit: note:")]
    assert len(notes) == 1 and "normalises text" in notes[0] and str(tokenizer) in notes[0], notes
    assert sorted(p.name for p in (tmp_path / "out" / "tokenizer").iterdir()) == ["tokenizer.model"]
    tokenizer.unlink()
    assert export(run, tmp_path / "gone") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.tokenizer" in err and str(tokenizer) in err, err
    assert not (tmp_path / "gone").exists()


def test_the_conversion_refuses_what_it_cannot_reproduce(tmp_path):
    from trainkit.errors import ConfigError
    from trainkit.weights.hf_tokenizer import tokenizer_files

    unigram = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TASKS * 20), model_writer=unigram, vocab_size=40,
                                   model_type="unigram", hard_vocab_limit=False)
    (tmp_path / "unigram.model").write_bytes(unigram.getvalue())
    files, problem = tokenizer_files(tmp_path / "unigram.model")
    assert problem and "not a BPE model" in problem and list(files) == ["tokenizer.model"]
    (tmp_path / "junk.model").write_bytes(b"\x0f\xff")
    with pytest.raises(ConfigError, match="not a SentencePiece model"):
        tokenizer_files(tmp_path / "junk.model")
