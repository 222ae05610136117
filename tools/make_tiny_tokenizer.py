"""Make trainkit's shipped tiny SentencePiece tokenizer, `trainkit/models/pi05/tiny_tokenizer.model`
(what `model.tokenizer = "tiny"` names, and `pi05_tiny.toml` uses).

    PYTHONPATH=$PWD .venv/bin/python tools/make_tiny_tokenizer.py trainkit/models/pi05/tiny_tokenizer.model

Why it exists: a tiny Pi0.5 run needs a SentencePiece model to export a folder that LeRobot 0.6.1
serves offline with nothing else (its tokenizer step loads a Hugging Face tokenizer folder, which the
export converts from the run's `tokenizer.model`: trainkit/weights/hf_tokenizer.py). PaliGemma's own
(257,152 pieces, 4 MB) does not fit a tiny model's 1,024-row embedding, and cannot be downloaded in
CI. This one is normalised as Gemma's is, so that it converts exactly: BPE, byte fallback (any
UTF-8 text encodes, no unknown token), no dummy prefix, identity normalisation, whitespace kept,
digits split; Gemma's special ids (pad 0, eos 1, bos 2, unk 3).

The text it is trained on is built here, deterministically: Pi0.5 prompts as openpi writes them
(`Task: {task}, State: {bins};\\nAction: `) over a few household-robot tasks and every state bin
0..255, plus the printable ASCII characters. One thread and a fixed input order make the output
byte for byte the same on every run with the same sentencepiece (`MADE_WITH`; tests/trainkit/weights/test_tokenizer_source.py
retrains it and compares).
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

MADE_WITH = "0.2.3"  # the sentencepiece version the shipped file was made with (another may train other bytes)
VOCAB = 512  # 4 specials + 256 byte pieces + merges; fits the tiny preset's 1,024-row embedding
TASKS = ("pick up the red cube", "open the top drawer", "close the drawer", "put the bowl on the plate",
         "push the block to the left", "stack the green block on the blue block", "wipe the table",
         "fold the towel", "pour water into the cup", "place the spoon in the sink", "turn on the light",
         "move the arm to the home position")


def corpus() -> list[str]:
    """The training sentences, in a fixed order."""
    lines = []
    for i in range(256):
        task = TASKS[i % len(TASKS)]
        bins = " ".join(str((i * 37 + 11 * j) % 256) for j in range(8))
        lines.append(f"Task: {task}, State: {bins};\nAction: ")
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def train() -> bytes:
    """The model's bytes (sentencepiece's trainer, one thread)."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()), model_writer=buf, vocab_size=VOCAB, model_type="bpe",
        character_coverage=1.0, byte_fallback=True, add_dummy_prefix=False, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", num_threads=1, minloglevel=2)
    return buf.getvalue()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    Path(argv[0]).write_bytes(train())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
