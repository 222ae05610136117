"""GR00T N1.7's prompt: the Qwen3-VL tokenizer and chat template, read from the backbone's tokenizer
files with the `tokenizers` package (no transformers), laid out as LeRobot 0.6.1's
`GrootN17VLMEncodeStep` lays it out.

One sample: the task (formalised: lower case, only letters, digits, spaces and "_"; an empty task
is "Perform the task.") in one user turn after its views, rendered by the checkpoint's chat
template with `add_generation_prompt=False` (Qwen3-VL's: `<|im_start|>user\\n` then
`<|vision_start|><|image_pad|><|vision_end|>` per view, the text, `<|im_end|>\\n`); each
`<|image_pad|>` is then repeated `tokens_per_image` times (64 at 256x256), as Qwen3-VL's processor
does, and the text is encoded (special tokens split out first, as transformers' fast tokenizer
does). Samples are padded on the left with the pad token (LeRobot's `padding_side = "left"`), to
the longest of the batch (LeRobot's `padding=True`) or to a fixed `length` (fixed shapes for CUDA
graphs: N1.7's head attends to padded positions without a mask, so the padding length changes its
output slightly; the fixed length is a choice, not LeRobot's).

Sources: `QwenChatTokenizer.from_folder(path)`: `tokenizer.json`, the chat template
(`chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`, else the processor's
`chat_template.json`) and the pad token
(`tokenizer_config.json`'s `pad_token`, else `<|endoftext|>` as transformers' `Qwen2Tokenizer`)
of a Cosmos-Reason2-2B / Qwen3-VL folder.
`QwenChatTokenizer.builtin()`: for runs from random weights with no tokenizer files, a byte-level
tokenizer (one token per UTF-8 byte, ids 0..255) with Qwen's special tokens at ids 256..261 (or at
Qwen's own ids, `qwen_ids`, for a model of Qwen's vocabulary) and a chat template of Qwen3-VL's
layout; NOT Qwen's vocabulary.
The template renders with jinja2 (a torch dependency) in a sandbox set up as transformers sets
it up (trim_blocks, lstrip_blocks, loop controls, `tojson`, `raise_exception`), once per number
of views, a folder's in a child process bounded in time, memory and output (chat_render.py); the
task goes where the template put the text part. Refused in one line naming the template's file:
a template that fails or runs away, that does not lay out exactly one
`<|vision_start|><|image_pad|><|vision_end|>` run per view (the model would train blind), that
does not place the task text once as given, or whose own text (the prompt less its views' runs
and the task) is longer than the model's text budget (`text_len`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainkit.errors import TokenizerError
from trainkit.models.gr00t.chat_render import TASK_SENTINEL, RenderError, render_shapes

if TYPE_CHECKING:
    from tokenizers import Tokenizer

IMAGE_PAD = "<|image_pad|>"
IMAGE_RUN = "<|vision_start|><|image_pad|><|vision_end|>"  # one view's place in the chat turn
DEFAULT_TASK = "Perform the task."
# Qwen's special tokens the layout uses, in the builtin tokenizer's id order (256..)
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", IMAGE_PAD)
QWEN_IDS = (151_643, 151_644, 151_645, 151_652, 151_653, 151_655)  # their ids in Qwen's (Cosmos-Reason2-2B's) vocabulary
BUILTIN_TEMPLATE = (  # Qwen3-VL's layout of user / assistant turns with image and text parts
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}"
    "{%- for part in message.content %}"
    "{%- if part.type == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part.type == 'text' %}{{- part.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def formalize(task: str) -> str:
    """N1.7's `formalize_language`: lower case, keeping letters, digits, whitespace and "_"."""
    return "".join(ch for ch in task.lower() if ch.isalnum() or ch.isspace() or ch == "_")


def _chat_template(folder: Path, config: dict) -> tuple[str, Path]:
    """The folder's chat template and the file it is in: chat_template.jinja, else
    tokenizer_config.json's chat_template (a string, or named templates: the "default" one), else the
    processor's chat_template.json."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(), folder / "chat_template.jinja"
    template, file = config.get("chat_template"), folder / "tokenizer_config.json"
    if template is None and (folder / "chat_template.json").is_file():
        file = folder / "chat_template.json"
        try:
            template = json.loads((folder / "chat_template.json").read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError) as e:
            raise TokenizerError(f"{folder}/chat_template.json: unreadable ({str(e)[:120]})") from None
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if not isinstance(template, str):
        raise TokenizerError(f"{folder}: no chat template (chat_template.jinja, tokenizer_config.json's "
                             "chat_template or chat_template.json)")
    return template, file


def _token_text(value: object) -> str | None:
    """A special token of tokenizer_config.json: a string or {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


class QwenChatTokenizer:
    """Task strings + views per sample -> (input_ids, attention_mask) in N1.7's layout."""

    def __init__(self, tokenizer: Tokenizer, template: str, specials: dict[str, str], *, tokens_per_image: int,
                 formalize_language: bool = True, source: str = "the builtin chat template", trusted: bool = False,
                 text_len: int | None = None):
        self.tokenizer = tokenizer
        self.template = template
        self.source = source          # the template's file, for messages
        self.trusted = trusted        # the builtin template renders in this process
        self.text_len = text_len      # the model's text budget: the template's own tokens at most (None: unbounded)
        self.specials = specials  # bos_token / eos_token / pad_token ...: the template may read them
        self.tokens_per_image = tokens_per_image
        self.formalize_language = formalize_language
        self._shapes: dict[int, tuple[str, str]] = {}  # views -> (text before the task, after), pads repeated
        ids = {tok: tokenizer.token_to_id(tok) for tok in (IMAGE_PAD, specials.get("pad_token", ""))}
        missing = [tok for tok, i in ids.items() if i is None]
        if missing:
            raise TokenizerError(f"the tokenizer has no {', '.join(map(repr, missing))} token")
        self.image_token_id, self.pad_id = ids[IMAGE_PAD], ids[specials["pad_token"]]

    @classmethod
    def from_folder(cls, path: str | Path, *, tokens_per_image: int, formalize_language: bool = True,
                    text_len: int | None = None) -> QwenChatTokenizer:
        """The tokenizer files of a Qwen3-VL checkpoint folder (module docstring)."""
        from tokenizers import Tokenizer

        folder = Path(path)
        if not (folder / "tokenizer.json").is_file():
            raise TokenizerError(f"{folder}: no tokenizer.json (the backbone's tokenizer folder, e.g. Cosmos-Reason2-2B)")
        try:
            tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            config = json.loads((folder / "tokenizer_config.json").read_text()) \
                if (folder / "tokenizer_config.json").is_file() else {}
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception; OSError and JSON errors too
            raise TokenizerError(f"{folder}: unreadable tokenizer files ({str(e)[:160]})") from None
        template, file = _chat_template(folder, config)
        specials = {k: t for k, v in config.items() if k.endswith("_token") and (t := _token_text(v)) is not None}
        specials.setdefault("pad_token", SPECIAL[0])  # transformers' Qwen2Tokenizer pads with <|endoftext|> by default
        return cls(tokenizer, template, specials, tokens_per_image=tokens_per_image,
                   formalize_language=formalize_language, source=str(file), text_len=text_len)

    @classmethod
    def builtin(cls, *, tokens_per_image: int, formalize_language: bool = True,
                qwen_ids: bool = False, text_len: int | None = None) -> QwenChatTokenizer:
        """The byte-level stand-in (module docstring); vocab 262, or the special tokens at Qwen's ids
        (`qwen_ids`: QWEN_IDS, so that it fits a model of Qwen's vocabulary built from random weights)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins of the bytes
        byte_chars = sorted(alphabet, key=lambda ch: _byte_of(ch))
        vocab = {ch: i for i, ch in enumerate(byte_chars)}
        vocab.update(zip(SPECIAL, QWEN_IDS if qwen_ids else range(256, 256 + len(SPECIAL))))
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens(list(SPECIAL))
        return cls(tokenizer, BUILTIN_TEMPLATE, {"pad_token": SPECIAL[0], "eos_token": SPECIAL[2]},
                   tokens_per_image=tokens_per_image, formalize_language=formalize_language, trusted=True,
                   text_len=text_len)

    def prepare(self, views: list[int]) -> None:
        """Render the template for each number of views not rendered yet (module docstring), and
        check each rendering; TokenizerError (one line naming the template's file) otherwise."""
        todo = sorted({v for v in views if v not in self._shapes})
        if not todo:
            return
        try:
            rendered = render_shapes(self.template, todo, self.specials, trusted=self.trusted)
        except RenderError as e:
            raise TokenizerError(f"{self.source}: the chat template {e}") from None
        for v, text in zip(todo, rendered):
            self._shapes[v] = self._checked(text, v)

    def _checked(self, text: str, views: int) -> tuple[str, str]:
        runs, pads, places = text.count(IMAGE_RUN), text.count(IMAGE_PAD), text.count(TASK_SENTINEL)
        if runs != views or pads != views:
            raise TokenizerError(f"{self.source}: the chat template lays out {runs} {IMAGE_RUN} runs ({pads} "
                                 f"{IMAGE_PAD}) for {views} views, not one per view: the model would not see its "
                                 "images as trained")
        if places != 1:
            raise TokenizerError(f"{self.source}: the chat template places the task text {places} times, not once "
                                 "as given")
        before, after = text.split(TASK_SENTINEL)
        if self.text_len is not None:
            own = len(self.tokenizer.encode(before + after).ids) - 3 * views  # less each view's start, pad, end
            if own > self.text_len:
                raise TokenizerError(f"{self.source}: the chat template's own text is {own} tokens besides the "
                                     f"views and the task, beyond the model's text_len {self.text_len}")
        expand = IMAGE_PAD * self.tokens_per_image
        return before.replace(IMAGE_PAD, expand), after.replace(IMAGE_PAD, expand)

    def prompt(self, task: str, views: int) -> str:
        """One sample's text: the rendered chat turn with each image pad repeated."""
        task = task or DEFAULT_TASK
        text = formalize(task) if self.formalize_language else task
        if views not in self._shapes:
            self.prepare([views])
        before, after = self._shapes[views]
        return before + text + after

    def encode(self, tasks: list[str], views: int, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids (B, T) int64, attention_mask (B, T) bool), left-padded to T = the longest
        sample, or to `length` (TokenizerError when a sample is longer)."""
        encoded = [e.ids for e in self.tokenizer.encode_batch([self.prompt(t, views) for t in tasks])]
        longest = max(map(len, encoded), default=0)
        t = longest if length is None else length
        if longest > t:
            raise TokenizerError(f"a prompt of {longest} tokens ({views} views x {self.tokens_per_image} image tokens "
                                 f"and its text) exceeds the fixed length {t}")
        ids = torch.full((len(tasks), t), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(tasks), t), dtype=torch.bool)
        for i, row in enumerate(encoded):
            if row:
                ids[i, t - len(row):] = torch.tensor(row, dtype=torch.int64)
                mask[i, t - len(row):] = True
        return ids, mask


def _byte_of(ch: str) -> int:
    """The byte GPT-2's byte-level alphabet maps to printable character `ch`."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if ord(ch) in printable:
        return ord(ch)
    rest = [b for b in range(256) if b not in printable]
    return rest[ord(ch) - 256]
