"""The teacher-forcing sequence of one `dreamzero` sample and its block-causal attention pattern.

Token order (blocks b = 0..n, n = latent frames after the first / frames_per_block):

    [ clean 0: latent frame 0 + state | clean 1 | ... | clean n | noisy 1 + actions 1 | ... | noisy n + actions n ]

Block 0 is the conditioning frame and the state tokens; it has a clean part only. Block i >= 1 has
a clean part (its latent frames) and a noisy part (the same frames noised at the block's flow time,
then its chunk of actions, noised at the same time). Attention (DreamZero's teacher forcing):
- clean tokens of block i see the clean tokens of blocks <= i;
- noisy and action tokens of block i see the clean tokens of blocks < i and the noisy and action
  tokens of block i.
With the clean parts first, the keys of a clean block are a prefix of the sequence, and the keys of
a noisy block are a prefix plus the block itself: `calls` lists one (queries, key ranges) per
part, which the "blocks" kernel runs as one unmasked attention each.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from trainkit.models.dreamzero.config import DreamZeroConfig

Span = tuple[int, int]  # [start, end) token positions


class Call(NamedTuple):
    """One attention of the block-causal pattern: these queries see exactly these key spans."""

    queries: Span
    keys: tuple[Span, ...]


@dataclass(frozen=True)
class TokenSequence:
    """Token counts of the parts of one sample's sequence (module docstring)."""

    tokens_per_frame: int
    frames_per_block: int
    blocks: int  # action blocks 1..n
    actions_per_block: int
    state_tokens: int
    # the attention pattern, one call per part: clean 0..n, then noisy 1..n (computed once, at
    # construction: a plain attribute, so torch.compile reads it without tracing a cache)
    calls: tuple[Call, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        calls = [Call((0, self.block0), ((0, self.block0),))]
        calls += [Call((self.clean_end(i - 1), self.clean_end(i)), ((0, self.clean_end(i)),))
                  for i in range(1, self.blocks + 1)]
        calls += [Call(self.noisy_span(i), ((0, self.clean_end(i - 1)), self.noisy_span(i)))
                  for i in range(1, self.blocks + 1)]
        object.__setattr__(self, "calls", tuple(calls))

    @classmethod
    def of(cls, cfg: DreamZeroConfig) -> TokenSequence:
        return cls(tokens_per_frame=cfg.tokens_per_frame, frames_per_block=cfg.frames_per_block, blocks=cfg.blocks,
                   actions_per_block=cfg.actions_per_block, state_tokens=cfg.state_tokens)

    @property
    def block0(self) -> int:
        return self.tokens_per_frame + self.state_tokens

    @property
    def clean_block(self) -> int:
        return self.frames_per_block * self.tokens_per_frame

    @property
    def noisy_block(self) -> int:
        """Tokens of one noisy part: its noisy latent frames, then its actions."""
        return self.clean_block + self.actions_per_block

    @property
    def clean(self) -> int:
        return self.block0 + self.blocks * self.clean_block

    @property
    def total(self) -> int:
        return self.clean + self.blocks * self.noisy_block

    def clean_end(self, i: int) -> int:
        """End of the clean part of block i (the clean tokens of blocks <= i are [0, clean_end(i)))."""
        return self.block0 + i * self.clean_block

    def noisy_span(self, i: int) -> Span:
        start = self.clean + (i - 1) * self.noisy_block
        return start, start + self.noisy_block

    @property
    def attended_pairs(self) -> int:
        """(query, key) pairs the pattern computes: what the FLOP count counts."""
        return sum((q1 - q0) * sum(k1 - k0 for k0, k1 in keys) for (q0, q1), keys in self.calls)

    def token_blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(block, noisy) per token, as int64 / bool tensors (FlexAttention's mask reads them)."""
        block = [0] * self.block0 + [i for i in range(1, self.blocks + 1) for _ in range(self.clean_block)]
        block += [i for i in range(1, self.blocks + 1) for _ in range(self.noisy_block)]
        noisy = [False] * self.clean + [True] * (self.blocks * self.noisy_block)
        return torch.tensor(block), torch.tensor(noisy)

    def dense_mask(self) -> torch.Tensor:
        """(T, T) bool, True = query row may attend to key column (built from `calls`)."""
        mask = torch.zeros(self.total, self.total, dtype=torch.bool)
        for (q0, q1), keys in self.calls:
            for k0, k1 in keys:
                mask[q0:q1, k0:k1] = True
        return mask
