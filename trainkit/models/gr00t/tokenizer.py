"""A small deterministic tokenizer for GR00T prompts. NOT Qwen3's tokenizer: no tokenizer weights can
be fetched, so the task string is encoded as its UTF-8 bytes (the state goes to the action head's
state encoder, not into the text, as in N1.6).

Layout of one sample (text_len tokens): [BOS] task bytes... [EOS] [PAD]...; ids 0 PAD, 1 BOS,
2 EOS, 3..258 the bytes 0..255. Too long a task is cut; BOS always stays, so every sample has a
valid text token (the text cross-attention needs one). Padding sits at the end, so under the
LLM's causal attention no valid token ever sees it.
"""
from __future__ import annotations

import torch

from trainkit.errors import TokenizerError

PAD, BOS, EOS = 0, 1, 2
BYTE_OFFSET = 3


class Gr00tTokenizer:
    """Encodes task strings into fixed-length token ids and a validity mask."""

    def __init__(self, vocab: int, text_len: int):
        if vocab < BYTE_OFFSET + 256:
            raise TokenizerError(f"vocab {vocab} is too small: the bytes need {BYTE_OFFSET + 256} ids")
        if text_len < 2:
            raise TokenizerError(f"text_len {text_len} is too small (BOS and EOS need 2)")
        self.text_len = text_len

    def encode_one(self, task: str) -> list[int]:
        """Token ids (unpadded) of one prompt; the task bytes are cut to fit."""
        clean = task.strip().replace("_", " ").replace("\n", " ")
        return [BOS, *(BYTE_OFFSET + b for b in clean.encode("utf-8")[: self.text_len - 2]), EOS]

    def encode(self, tasks: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, text_len) int64, token_mask (B, text_len) bool) for B task strings."""
        tokens = torch.full((len(tasks), self.text_len), PAD, dtype=torch.int64)
        for i, task in enumerate(tasks):
            ids = self.encode_one(task)
            tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return tokens, tokens != PAD
