"""The token sequence of one `dreamzero` sample, its block-causal attention pattern, and what each
token is (for RoPE and the time modulation).

DreamZero's teacher forcing (the official `CausalWanModel._forward_train`) runs
[clean latents | noisy latents | actions | states]; here the same tokens are kept block by block,

    [ clean 0 | clean 1 | ... | clean n | noisy 0 | noisy 1, actions 1, states 1 | ... | noisy n, actions n, states n ]

a permutation of that order (attention does not see the order: positions are RoPE's, the pattern
is per token), chosen so that each flow-time segment is one contiguous span: clean (time 0), the
noisy conditioning frame (its own timestep), then one equal-sized group per block (the block's
timestep, shared by its latent frames, actions and states). Block 0 is the conditioning latent
frame; block i >= 1 has `frames_per_block` latent frames. Attention (the official pattern):
- clean frame 0 sees itself; clean block i sees the clean blocks <= i (the first frame included);
- noisy frame 0 sees itself;
- the noisy frames and actions of block i see the clean blocks < i and all of block i's noisy group;
- the states of block i see themselves.
Two deliberate differences from the official kernels: a clean block's queries see their whole
block (the official code batches the clean blocks into one `causal=True` call with fewer queries
than keys: token-causal inside the block under flash attention's bottom-right alignment, but
top-left aligned under its torch SDPA backend, so the pattern depends on the backend there); the
order above.

`plain` (one dense call over the video tokens, one segment) is Wan itself: what the diffusers
parity test runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import torch

from trainkit.models.dreamzero.config import DreamZeroConfig

Span = tuple[int, int]  # [start, end) token positions


class Call(NamedTuple):
    """One attention of the pattern: these queries see exactly these key spans."""

    queries: Span
    keys: tuple[Span, ...]


class Piece(NamedTuple):
    """A run of tokens of one kind, in sequence order: video tokens from latent frame `start`
    (whole frames), or the action / state tokens with 1-D RoPE positions from `start`."""

    kind: Literal["video", "action", "state"]
    start: int  # first latent frame (video) or 1-D position (action, state)
    count: int  # frames (video) or tokens


@dataclass(frozen=True)
class TokenSequence:
    """Token counts of the parts of one sample's sequence (module docstring)."""

    tokens_per_frame: int
    frames_per_block: int
    blocks: int  # action blocks 1..n
    actions_per_block: int
    states_per_block: int
    plain: bool = False  # plain Wan: the latent frames only, one dense attention, one time segment
    # the attention pattern, one call per part (computed once, at construction: a plain attribute,
    # so torch.compile reads it without tracing a cache)
    calls: tuple[Call, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.plain:
            calls = [Call((0, self.total), ((0, self.total),))]
        else:
            tpf, c = self.tokens_per_frame, self.clean
            calls = [Call((0, tpf), ((0, tpf),))]
            calls += [Call((self.clean_end(i - 1), self.clean_end(i)), ((0, self.clean_end(i)),))
                      for i in range(1, self.blocks + 1)]
            calls.append(Call((c, c + tpf), ((c, c + tpf),)))
            for i in range(1, self.blocks + 1):
                g0, g1 = self.group_span(i)
                s0 = g1 - self.states_per_block
                calls.append(Call((g0, s0), ((0, self.clean_end(i - 1)), (g0, g1))))
                calls.append(Call((s0, g1), ((s0, g1),)))
        object.__setattr__(self, "calls", tuple(calls))

    @classmethod
    def of(cls, cfg: DreamZeroConfig, plain: bool = False) -> TokenSequence:
        return cls(tokens_per_frame=cfg.tokens_per_frame, frames_per_block=cfg.frames_per_block, blocks=cfg.blocks,
                   actions_per_block=cfg.actions_per_block, states_per_block=cfg.states_per_block, plain=plain)

    @property
    def latent_frames(self) -> int:
        return 1 + self.blocks * self.frames_per_block

    @property
    def block_video(self) -> int:
        """Video tokens of one block (its latent frames)."""
        return self.frames_per_block * self.tokens_per_frame

    @property
    def group(self) -> int:
        """Tokens of one block's noisy group: its noisy latent frames, actions, states."""
        return self.block_video + self.actions_per_block + self.states_per_block

    @property
    def clean(self) -> int:
        """Clean tokens (all latent frames); 0 for plain Wan."""
        return 0 if self.plain else self.latent_frames * self.tokens_per_frame

    @property
    def total(self) -> int:
        if self.plain:
            return self.latent_frames * self.tokens_per_frame
        return self.clean + self.tokens_per_frame + self.blocks * self.group

    @property
    def segments(self) -> tuple[tuple[int, ...], int]:
        """The flow-time segments: (lengths of the leading ones, number of equal groups after them):
        plain (all tokens,), 0; teacher forcing (clean, noisy frame 0), blocks."""
        if self.plain:
            return (self.total,), 0
        return (self.clean, self.tokens_per_frame), self.blocks

    def clean_end(self, i: int) -> int:
        """End of the clean part of block i (the clean tokens of blocks <= i are [0, clean_end(i)))."""
        return self.tokens_per_frame + i * self.block_video

    def group_span(self, i: int) -> Span:
        start = self.clean + self.tokens_per_frame + (i - 1) * self.group
        return start, start + self.group

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """What each token is, in sequence order (RoPE's positions: trainkit/models/dreamzero/rope.py)."""
        if self.plain:
            return (Piece("video", 0, self.latent_frames),)
        out = [Piece("video", 0, self.latent_frames), Piece("video", 0, 1)]
        for i in range(self.blocks):
            out += [Piece("video", 1 + i * self.frames_per_block, self.frames_per_block),
                    Piece("action", i * self.actions_per_block, self.actions_per_block),
                    Piece("state", i * self.states_per_block, self.states_per_block)]
        return tuple(out)

    def noisy_video_index(self) -> torch.Tensor:
        """(latent_frames * tokens_per_frame,) int64: the sequence positions of the noisy video
        tokens in frame order (what the head reads)."""
        if self.plain:
            return torch.arange(self.total)
        c, tpf = self.clean, self.tokens_per_frame
        parts = [torch.arange(c, c + tpf)] + [torch.arange(g0, g0 + self.block_video)
                                              for g0, _ in map(self.group_span, range(1, self.blocks + 1))]
        return torch.cat(parts)

    def action_index(self) -> torch.Tensor:
        """(blocks * actions_per_block,) int64: the action tokens' positions, in action order."""
        return torch.cat([torch.arange(g0 + self.block_video, g0 + self.block_video + self.actions_per_block)
                          for g0, _ in map(self.group_span, range(1, self.blocks + 1))])

    @property
    def attended_pairs(self) -> int:
        """(query, key) pairs the pattern computes: what the FLOP count counts."""
        return sum((q1 - q0) * sum(k1 - k0 for k0, k1 in keys) for (q0, q1), keys in self.calls)

    def dense_mask(self) -> torch.Tensor:
        """(T, T) bool, True = query row may attend to key column (built from `calls`)."""
        mask = torch.zeros(self.total, self.total, dtype=torch.bool)
        for (q0, q1), keys in self.calls:
            for k0, k1 in keys:
                mask[q0:q1, k0:k1] = True
        return mask
