"""Pi0.5's prompt tokenizers, by what `model.tokenizer` names (`sentencepiece_file`):
- a path (a `tokenizer.model`, or a folder with one): that SentencePiece model with openpi's Pi0.5
  prompt (`PaligemmaPromptTokenizer`); PaliGemma's is what checkpoints of `lerobot/pi05_base` were
  trained with;
- "tiny": the same prompt with trainkit's shipped tiny SentencePiece model (`tiny_tokenizer.model`,
  512 pieces normalised as Gemma's; made by tools/make_tiny_tokenizer.py), which `pi05_tiny` uses so
  that a tiny run's export is served by LeRobot offline with nothing else;
- "builtin", or "" when nothing chose one (a run from random weights; with `model.init_from` the
  checkpoint's own tokenizer is taken first: trainkit/weights/tokenizer_source.py): a small
  deterministic tokenizer of our own (`PromptTokenizer`), NOT Gemma's, which LeRobot cannot serve:
  the task string is encoded as UTF-8 bytes and the robot state as bin ids.

Layout of one sample (text_len tokens): [BOS] task bytes... [STATE] state bins... [ACTION] [PAD]...
Ids: 0 PAD, 1 BOS, 2 STATE, 3 ACTION, 4..259 bytes 0..255, 260.. the state bins.
Like Pi0.5 (OpenPI `discretize` of the normalised state), each state value in [-1, 1] is cut into
`state_bins` equal bins: bin = digitize(x, linspace(-1, 1, bins + 1)[:-1]) - 1, clipped to the range.
When the prompt is too long the task bytes are cut, never the state; BOS always stays, so every
sample has at least one valid prefix token (the joint attention needs one).
"""
from __future__ import annotations

from pathlib import Path

import torch

from trainkit.errors import TokenizerError

BUILTIN, TINY = "builtin", "tiny"  # the two words model.tokenizer takes besides a path
TINY_MODEL = Path(__file__).with_name("tiny_tokenizer.model")


def sentencepiece_file(name: str) -> Path | None:
    """The SentencePiece file `model.tokenizer` names; None for the built-in tokenizer."""
    if name in ("", BUILTIN):
        return None
    if name == TINY:
        return TINY_MODEL
    return Path(name) / "tokenizer.model" if Path(name).is_dir() else Path(name)


PAD, BOS, STATE, ACTION = 0, 1, 2, 3
BYTE_OFFSET = 4
STATE_OFFSET = BYTE_OFFSET + 256


class PromptTokenizer:
    """Encodes (task string, state vector) pairs into fixed-length token ids and a validity mask."""

    def __init__(self, vocab: int, text_len: int, state_bins: int = 256):
        if vocab < STATE_OFFSET + state_bins:
            raise TokenizerError(f"vocab {vocab} is too small: bytes and {state_bins} state bins need {STATE_OFFSET + state_bins}")
        if state_bins < 1 or text_len < 4:
            raise TokenizerError(f"state_bins {state_bins} / text_len {text_len} too small")
        self.vocab, self.text_len, self.state_bins = vocab, text_len, state_bins
        # left bin edges, as np.linspace(-1, 1, bins + 1)[:-1] in float64
        self.edges = torch.linspace(-1.0, 1.0, state_bins + 1, dtype=torch.float64)[:-1]

    def state_bins_of(self, state: torch.Tensor) -> torch.Tensor:
        """Bin index (int64, 0..state_bins-1) of every value of a normalised state (any shape)."""
        x = state.detach().to("cpu", torch.float64)
        if not torch.isfinite(x).all():
            raise TokenizerError("state holds NaN or inf; normalise it before tokenizing")
        # np.digitize(x, edges) (right=False) = number of edges <= x = bucketize(..., right=True)
        return (torch.bucketize(x, self.edges, right=True) - 1).clamp(0, self.state_bins - 1)

    def encode_one(self, task: str, state_bins: list[int]) -> list[int]:
        """Token ids (unpadded) of one prompt; the task bytes are cut to fit."""
        room = self.text_len - 3 - len(state_bins)  # BOS, STATE, ACTION
        if room < 0:
            raise TokenizerError(f"state of {len(state_bins)} values does not fit text_len {self.text_len}")
        clean = task.strip().replace("_", " ").replace("\n", " ")
        task_ids = [BYTE_OFFSET + b for b in clean.encode("utf-8")[:room]]
        return [BOS, *task_ids, STATE, *(STATE_OFFSET + b for b in state_bins), ACTION]

    def encode(self, tasks: list[str], state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, text_len) int64, token_mask (B, text_len) bool) for B task strings and a
        (B, D) normalised state. Deterministic: the same input gives the same ids on any machine."""
        if state.ndim != 2 or state.shape[0] != len(tasks):
            raise TokenizerError(f"state must be (B={len(tasks)}, D), got {tuple(state.shape)}")
        bins = self.state_bins_of(state).tolist()
        tokens = torch.full((len(tasks), self.text_len), PAD, dtype=torch.int64)
        for i, (task, row) in enumerate(zip(tasks, bins)):
            ids = self.encode_one(task, row)
            tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return tokens, tokens != PAD


class PaligemmaPromptTokenizer:
    """PaliGemma's SentencePiece tokenizer (`tokenizer.model`) with Pi0.5's prompt, as openpi's
    `PaligemmaTokenizer.tokenize(prompt, state)` builds it: the cleaned task and the state's 256-bin
    ids as text, `"Task: {task}, State: {b0 b1 ...};\\nAction: "`, encoded with BOS, padded with 0
    (mask False) or cut at `text_len`. Same `encode(tasks, state)` as `PromptTokenizer`."""

    def __init__(self, path: str, vocab: int, text_len: int, state_bins: int = 256):
        try:
            import sentencepiece
        except ImportError:
            raise TokenizerError(f"model.tokenizer {path}: needs the `sentencepiece` package") from None
        model = sentencepiece_file(path) or Path(path)
        try:
            self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"model.tokenizer {model}: not a SentencePiece model ({str(e)[:120]})") from None
        if self.sp.get_piece_size() > vocab:
            raise TokenizerError(f"model.tokenizer {model}: {self.sp.get_piece_size()} pieces do not fit the "
                                 f"model's vocab {vocab}")
        self.text_len = text_len
        self.bins = PromptTokenizer(STATE_OFFSET + state_bins, text_len, state_bins)  # the same discretisation

    def prompt(self, task: str, state_bins: list[int]) -> str:
        clean = task.strip().replace("_", " ").replace("\n", " ")
        return f"Task: {clean}, State: {' '.join(map(str, state_bins))};\nAction: "

    def encode(self, tasks: list[str], state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if state.ndim != 2 or state.shape[0] != len(tasks):
            raise TokenizerError(f"state must be (B={len(tasks)}, D), got {tuple(state.shape)}")
        bins = self.bins.state_bins_of(state).tolist()
        tokens = torch.zeros((len(tasks), self.text_len), dtype=torch.int64)
        mask = torch.zeros((len(tasks), self.text_len), dtype=torch.bool)
        for i, (task, row) in enumerate(zip(tasks, bins)):
            ids = self.sp.encode(self.prompt(task, row), add_bos=True)[: self.text_len]
            tokens[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
            mask[i, :len(ids)] = True
        return tokens, mask
