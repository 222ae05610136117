"""What an export carries beside its weights so that LeRobot or openpi can serve it.

    files, notes = serving_files(fam, model_cfg, policy, stats, norm, fmt, out, tokenizer_name, notes)

- `--format lerobot`: LeRobot 0.6.1's processor pipelines for the policy (the family's steps,
  lerobot_processors.py), with the statistics the run trained with, so that
  `make_pre_post_processors(cfg, pretrained_path=OUT)` + `policy.select_action` run on a raw
  observation (images, state, task string). Without statistics (the run's dataset index unreadable)
  no pipeline is written: a pipeline without them would pass the state through unnormalised.
- `--format openpi`: `assets/trainkit/norm_stats.json` (openpi's layout; its asset id "trainkit").
- Both: the run's tokenizer (`model.tokenizer`) in `tokenizer/`: its SentencePiece model, and
  where it converts exactly a Hugging Face tokenizer folder (hf_tokenizer.py). LeRobot's tokenizer
  step names a tokenizer by Hub name or path and loads it with `AutoTokenizer.from_pretrained`;
  LeRobot's own pi05 exports name "google/paligemma-3b-pt-224", which needs the network or the Hub
  cache. Here the step names OUT/tokenizer by its absolute path (works offline, on this machine)
  unless `tokenizer_name` is given (e.g. the Hub name, for an upload); a run with no
  `model.tokenizer` gets the family's default and a note.
- README.txt: what the folder holds and what a LeRobot or openpi user still needs: the family's
  text (`Weights.readme`, e.g. trainkit/models/pi05/readme.py), given the export's `ServingFacts`.
`notes` are the places where the served policy would not see what the trained one saw (the
exporter prints them; README.txt repeats them).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainkit.errors import ConfigError
from trainkit.models.family import Family, ServingFacts
from trainkit.weights.hf_tokenizer import tokenizer_files
from trainkit.weights.lerobot_processors import Stats, processor_files
from trainkit.weights.norm_stats import OPENPI_STATS, stats_files

TOKENIZER_DIR = "tokenizer"
README = "README.txt"


def _run_tokenizer(model_cfg: Any) -> Path | None:
    """The SentencePiece file the run's prompts were built with (`model.tokenizer`: a file or a
    folder holding tokenizer.model), None when the family or the run has none."""
    if hasattr(model_cfg, "tokenizer_file"):  # the family resolves its words ("tiny", "builtin")
        path = model_cfg.tokenizer_file()
        if path is None:
            return None
    else:
        name = getattr(model_cfg, "tokenizer", "")
        if not name:
            return None
        path = Path(name) / "tokenizer.model" if Path(name).is_dir() else Path(name)
    if not path.is_file():
        raise ConfigError("model.tokenizer", f"{path}: not found (the run's tokenizer, which the export carries; "
                          "export from the run's working directory or put the file back)")
    return path


def serving_files(fam: Family, model_cfg: Any, policy: Mapping[str, Any], stats: Stats | None, norm: str, fmt: str,
                  out: Path, tokenizer_name: str | None, notes: Sequence[str] = ()
                  ) -> tuple[dict[str, bytes], list[str]]:
    """(files by relative name, notes) for an export to `out` (its final, absolute path) of format `fmt`;
    `policy`: its config.json; `norm`: the run's data.norm; `notes`: the exporter's own, first
    (a mixture's source: which one, its prompt)."""
    files: dict[str, bytes] = {}
    notes = list(notes)
    own = fam.weights is not None and fam.weights.lerobot_policy is not None and fmt == "lerobot"
    tokenizer = None if own else _run_tokenizer(model_cfg)  # the family's lerobot_policy carries its own
    converted = own
    if tokenizer is not None:
        tok_files, problem = tokenizer_files(tokenizer)
        files.update({f"{TOKENIZER_DIR}/{k}": v for k, v in tok_files.items()})
        converted = problem is None
        if problem:
            notes.append(f"model.tokenizer {problem}: no Hugging Face tokenizer could be written that tokenizes "
                         f"as it does, so LeRobot's tokenizer step names the default tokenizer")
    if stats is not None and fmt == "openpi":
        files.update(stats_files(stats, fmt, norm))
    loads, written = None, False  # the tokenizer the processors load; processor files written
    if fmt == "lerobot" and fam.weights is not None and fam.weights.lerobot_processors is not None:
        pipelines, family_notes = fam.weights.lerobot_processors(
            model_cfg, policy, tokenizer_name or (str(out / TOKENIZER_DIR) if converted else None))
        if stats is None:
            notes.append("no statistics (the run's dataset index is unreadable), so no processor files: "
                         "LeRobot's make_pre_post_processors(cfg, pretrained_path=OUT) will not find them")
        else:
            files.update(processor_files(pipelines, policy, stats, norm, fam.weights.min_max_steps))
            notes += family_notes
        loads, written = _tokenizer_name(pipelines, fam.weights.tokenizer_step), stats is not None
    if fam.weights is not None and fam.weights.readme is not None:  # the family's own text, by format
        stats_file = OPENPI_STATS if stats is not None and fmt == "openpi" else None
        text = fam.weights.readme(ServingFacts(fmt, policy, loads, tokenizer is not None, written, stats_file,
                                               norm, tuple(notes), converted and tokenizer is not None))
        if text:
            files[README] = text.encode()
    return files, notes


def _tokenizer_name(pipelines: Mapping[str, list[dict[str, Any]]], step: tuple[str, str]) -> str | None:
    """The tokenizer the family's tokenizer step (registry name, config key) loads, None without one."""
    registry, key = step
    found = [s for steps in pipelines.values() for s in steps if s["registry_name"] == registry]
    return found[0]["config"].get(key) if found else None
