"""A SentencePiece model (PaliGemma's `tokenizer.model`, what `model.tokenizer` names) as the Hugging
Face tokenizer folder LeRobot's tokenizer step loads, offline: `AutoTokenizer.from_pretrained(folder)`.

    files, problem = tokenizer_files(Path("tokenizer.model"))  # problem None: tokenizer.json, ... written

Why a tokenizer.json: transformers 5 builds Gemma's tokenizer from one; from a bare tokenizer.model
it needs the `sentencepiece` and `protobuf` packages, which `pip install lerobot[pi]` does not bring
(LeRobot's own pi05 checkpoints name "google/paligemma-3b-pt-224", whose Hub folder has one).

What is written, as transformers' SentencePiece conversion builds Gemma's: a BPE vocab of the pieces
by id; merges = every split of a normal piece into two pieces of the vocab, ordered by the merged
piece's id (SentencePiece's BPE numbers its pieces in merge order), then by the parts' ids; byte
fallback as the model has it; spaces -> "▁" and no dummy prefix; BOS prepended; control and unknown
pieces special added tokens, user-defined pieces plain added tokens. tokenizer_config.json names
`GemmaTokenizer`, whose own normaliser and pre-tokenizer are these. That is sentencepiece's encoding
only for a model normalised as Gemma's is (BPE, "identity" rules, no dummy prefix, whitespace kept
and escaped): `conversion_problem` names what else differs, and the export then says so. Checked
against `sentencepiece.encode` of prompts through LeRobot 0.6.1's transformers 5.5.4
(tests/trainkit/weights/test_trainkit_export_serving.py).

The model file is read with a small protobuf wire reader: sentencepiece's Python API does not expose
the normaliser settings, and its model_pb2 needs `protobuf`, which trainkit does not depend on.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainkit.errors import ConfigError

# ModelProto field numbers (sentencepiece_model.proto)
_PIECES, _TRAINER, _NORMALIZER = 1, 2, 3
_PIECE, _TYPE = 1, 3  # SentencePiece.piece, .type
_MODEL_TYPE, _WS_SUFFIX, _BYTE_FALLBACK = 3, 24, 35  # TrainerSpec
_UNK_ID, _BOS_ID, _EOS_ID, _PAD_ID = 40, 41, 42, 43  # TrainerSpec (defaults 0, 1, 2, -1)
_RULE_NAME, _CHARSMAP, _DUMMY_PREFIX, _STRIP_SPACES, _ESCAPE_SPACES = 1, 2, 3, 4, 5  # NormalizerSpec
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4  # SentencePiece.Type
BPE = 2  # TrainerSpec.ModelType
SPACE = "\u2581"  # "▁", SentencePiece's escaped space


@dataclass
class SentencePieceModel:
    """What the conversion reads from a `tokenizer.model`."""

    pieces: list[tuple[str, int]] = field(default_factory=list)  # (piece, type) by id
    trainer: dict[int, int | bytes] = field(default_factory=dict)  # TrainerSpec fields (the last of each)
    normalizer: dict[int, int | bytes] = field(default_factory=dict)  # NormalizerSpec fields

    def special(self, number: int, default: int) -> int:
        """The id of a special piece (unk/bos/eos/pad), -1 for none; varints are unsigned on the wire."""
        value = int(self.trainer.get(number, default))
        return value - (1 << 64) if value >= 1 << 63 else value


def _varint(b: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        c = b[i]
        out |= (c & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not c & 0x80:
            return out, i


def _fields(b: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: varints as ints, everything else as bytes."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(b, i)
        elif wire == 2:
            n, i = _varint(b, i)
            value, i = b[i:i + n], i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            value, i = b[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire}")
        if i > len(b):
            raise ValueError("truncated")
        yield number, value


def read_model(path: Path) -> tuple[SentencePieceModel, bytes]:
    """(the pieces and settings, the file's bytes) of a SentencePiece model file; ConfigError
    naming it when unreadable."""
    try:
        raw = path.read_bytes()
        model = SentencePieceModel()
        for number, value in _fields(raw):
            if number == _PIECES and isinstance(value, bytes):
                piece = dict(_fields(value))
                model.pieces.append((bytes(piece.get(_PIECE, b"")).decode(), int(piece.get(_TYPE, NORMAL))))
            elif number in (_TRAINER, _NORMALIZER) and isinstance(value, bytes):
                (model.trainer if number == _TRAINER else model.normalizer).update(_fields(value))
    except OSError as e:
        raise ConfigError("model.tokenizer", f"{path}: unreadable ({e.strerror or e})") from None
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise ConfigError("model.tokenizer", f"{path}: not a SentencePiece model ({e})") from None
    if not model.pieces:
        raise ConfigError("model.tokenizer", f"{path}: not a SentencePiece model (no pieces)")
    return model, raw


def conversion_problem(model: SentencePieceModel) -> str | None:
    """What makes a Gemma-style tokenizer.json encode differently from this model, or None."""
    t, n = model.trainer, model.normalizer
    if int(t.get(_MODEL_TYPE, 1)) != BPE:
        return "is not a BPE model (PaliGemma's is)"
    if bytes(n.get(_RULE_NAME, b"")).decode() not in ("identity", "") or n.get(_CHARSMAP):
        return "normalises text (a normalisation rule), which Gemma's tokenizer does not"
    if int(n.get(_DUMMY_PREFIX, 1)):
        return "adds a dummy prefix space, which Gemma's tokenizer does not"
    if int(n.get(_STRIP_SPACES, 1)) or not int(n.get(_ESCAPE_SPACES, 1)) or int(t.get(_WS_SUFFIX, 0)):
        return "strips or does not escape whitespace as Gemma's tokenizer does"
    if model.special(_BOS_ID, 1) < 0 or model.special(_UNK_ID, 0) < 0:
        return "has no BOS or no unknown piece"
    return None


def _merges(model: SentencePieceModel) -> list[list[str]]:
    vocab = {piece: i for i, (piece, _) in enumerate(model.pieces)}
    merges = []
    for piece, kind in model.pieces:
        if kind != NORMAL:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(vocab[piece], len(a), len(b), vocab[a], vocab[b], a, b) for a, b in splits]
    return [[a, b] for *_, a, b in sorted(merges)]


def _added_tokens(model: SentencePieceModel) -> list[dict[str, object]]:
    return [{"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": kind in (UNKNOWN, CONTROL)}
            for i, (piece, kind) in enumerate(model.pieces) if kind in (UNKNOWN, CONTROL, USER_DEFINED)]


def tokenizer_json(model: SentencePieceModel) -> dict[str, object]:
    """tokenizers' serialisation of the model (the module docstring says what and why)."""
    bos_id = model.special(_BOS_ID, 1)
    bos, unk = model.pieces[bos_id][0], model.pieces[model.special(_UNK_ID, 0)][0]
    start = {"SpecialToken": {"id": bos, "type_id": 0}}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": _added_tokens(model),
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": SPACE},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [start, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [start, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
                                                     {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": bool(model.trainer.get(_BYTE_FALLBACK, 0)),
                  "ignore_merges": False, "vocab": {piece: i for i, (piece, _) in enumerate(model.pieces)},
                  "merges": _merges(model)}}


def _specials(model: SentencePieceModel) -> dict[str, str]:
    names = {"unk_token": (_UNK_ID, 0), "bos_token": (_BOS_ID, 1), "eos_token": (_EOS_ID, 2), "pad_token": (_PAD_ID, -1)}
    ids = {name: model.special(number, default) for name, (number, default) in names.items()}
    return {name: model.pieces[i][0] for name, i in ids.items() if 0 <= i < len(model.pieces)}


def tokenizer_files(path: Path) -> tuple[dict[str, bytes], str | None]:
    """(the tokenizer folder's files by relative name, why transformers would not tokenize as the
    model does or None). Always the SentencePiece model itself (openpi and `model.tokenizer` read
    it); when it converts exactly, tokenizer.json, tokenizer_config.json, special_tokens_map.json."""
    model, raw = read_model(path)
    problem = conversion_problem(model)
    if problem:
        return {"tokenizer.model": raw}, f"{path} {problem}"
    specials = _specials(model)
    config = {"tokenizer_class": "GemmaTokenizer", "add_bos_token": True, "add_eos_token": False,
              "padding_side": "right", "clean_up_tokenization_spaces": False, "model_max_length": 1_000_000,
              **specials}

    def dump(body: object) -> bytes:
        return (json.dumps(body, ensure_ascii=False, indent=1) + "\n").encode()

    return {"tokenizer.json": dump(tokenizer_json(model)), "tokenizer_config.json": dump(config),
            "special_tokens_map.json": dump(specials), "tokenizer.model": raw}, None
