"""`model.tokenizer`: PaliGemma's SentencePiece tokenizer with openpi's Pi0.5 prompt (issue 17).

No tokenizer file can be downloaded, so a tiny SentencePiece model is trained here. The oracle is
openpi's `PaligemmaTokenizer.tokenize(prompt, state)` written out in numpy + sentencepiece below:
`np.digitize` of the state into 256 bins, the prompt string, BOS, zero padding, cut at max_len.
"""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from trainkit.errors import TokenizerError
from trainkit.models.pi05.tokenizer import PaligemmaPromptTokenizer
from trainkit_fixtures import cli_run, shards_rgb  # noqa: F401 - fixtures

spm = pytest.importorskip("sentencepiece")
TASKS = ["pick up the red cube", "open_the top drawer\n", "put the bowl on the plate and close the drawer"]


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    rng = np.random.default_rng(0)
    text = [f"Task: {t}, State: {' '.join(map(str, rng.integers(0, 256, 8)))};\nAction: " for t in TASKS * 30]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=120,
                                   model_type="bpe", character_coverage=1.0, bos_id=2, eos_id=1, pad_id=0,
                                   unk_id=3, hard_vocab_limit=False)
    path = tmp_path_factory.mktemp("sp") / "tokenizer.model"
    path.write_bytes(buf.getvalue())
    return path


def openpi_tokenize(sp, task: str, state: np.ndarray, max_len: int) -> tuple[list[int], list[bool]]:
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    bins = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    tokens = sp.encode(f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: ", add_bos=True)
    if len(tokens) < max_len:
        return tokens + [0] * (max_len - len(tokens)), [True] * len(tokens) + [False] * (max_len - len(tokens))
    return tokens[:max_len], [True] * max_len


@pytest.mark.parametrize("text_len", [96, 20])  # padded, and cut
def test_prompts_equal_openpis_paligemma_tokenizer(sp_model, text_len):
    sp = spm.SentencePieceProcessor(model_file=str(sp_model))
    state = torch.tensor(np.random.default_rng(1).uniform(-1, 1, (3, 8)), dtype=torch.float32)
    state[0, :3] = torch.tensor([-1.0, 1.0, 0.0])  # the edges
    tokens, mask = PaligemmaPromptTokenizer(str(sp_model.parent), 1024, text_len).encode(TASKS, state)
    for i, task in enumerate(TASKS):
        want_tokens, want_mask = openpi_tokenize(sp, task, state[i].double().numpy(), text_len)
        assert tokens[i].tolist() == want_tokens and mask[i].tolist() == want_mask


def test_a_tokenizer_larger_than_the_vocab_or_not_sentencepiece_is_refused(sp_model, tmp_path):
    with pytest.raises(TokenizerError, match="do not fit the model's vocab 64"):
        PaligemmaPromptTokenizer(str(sp_model), 64, 48)
    (tmp_path / "tokenizer.model").write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="not a SentencePiece model"):
        PaligemmaPromptTokenizer(str(tmp_path), 1024, 48)


def test_trainkit_run_trains_with_the_sentencepiece_prompt(sp_model, shards_rgb, tmp_path, capsys):  # noqa: F811
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "train.steps=2",
                        f"model.tokenizer={sp_model}", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert code == 0, err
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'bad'}", "train.steps=2",
                        f"model.tokenizer={tmp_path / 'missing.model'}", "parallel.fsdp=none")
    assert code == 2 and "missing.model" in err and len(err.splitlines()) == 1, err
