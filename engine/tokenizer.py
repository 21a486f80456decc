"""Text in, token ids out, and back: the API server's tokenizer (docs/ENGINE.md, Text).

A `tokenizer.json` (the `tokenizers` package) when the scenario names one
(`model.tokenizer`) or the checkpoint directory (`model.path`) holds one; `bytes`, the
built-in byte-level tokenizer (token id b < 256 is the byte b, an id from 256 up reads as
`<id>`); otherwise the default, one word per id of the model's vocabulary (`WordTokenizer`:
id 0 is `[UNK]`, id i the word `w<i>`), so a reply's text, re-tokenized by any client that
loads the same tokenizer.json (GET /v1/tokenizer.json), gives back the ids sent. Either way a
reply's text is decoded as it streams (`Tokenizer.stream`) and usage counts tokens, never
characters.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

BYTES = 256
BYTE_LEVEL = "bytes"  # model.tokenizer's name for the byte-level tokenizer
UNK = "[UNK]"
# What the default tokenizer.json's pre-tokenizer (WhitespaceSplit) splits on: Rust's
# char::is_whitespace, the Unicode White_Space property (str.split() also splits on \x1c-\x1f).
WHITESPACE = re.compile("[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
WORD = re.compile("w([1-9][0-9]*)")


class TokenizerError(ValueError):
    """A tokenizer that cannot be used with the model; the message says which file and why."""


class TextStream(Protocol):
    def step(self, token: int) -> str:
        """The text this token completes ("" while a character is still incomplete)."""
        ...


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...

    def stream(self) -> TextStream: ...


def unknown(token: int) -> str:
    """How an id the tokenizer has no text for reads."""
    return f"<{token}>"


class ByteTokenizer:
    """UTF-8 bytes as token ids 0-255; ids from 256 up read as `<id>`."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, tokens: list[int]) -> str:
        stream = self.stream()
        return "".join(stream.step(t) for t in tokens) + stream.flush()

    def stream(self) -> _ByteStream:
        return _ByteStream()


class _ByteStream:
    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token: int) -> str:
        if token < BYTES:
            return self._utf8.decode(bytes((token,)))
        return self.flush() + unknown(token)

    def flush(self) -> str:
        """Bytes of an unfinished character, as replacement characters."""
        return self._utf8.decode(b"", final=True)


class FileTokenizer:
    """A Hugging Face `tokenizer.json`; ids beyond its vocabulary read as `<id>`."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception for a bad file
            raise TokenizerError(f"cannot read the tokenizer {path}: {exc}") from None
        self.name = str(path)
        self.size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        stream = self.stream()
        return "".join(stream.step(t) for t in tokens)

    def stream(self) -> _FileStream:
        return _FileStream(self)


class WordTokenizer:
    """One word per id of a vocabulary of `size`: id 0 is `[UNK]`, id i the word `w<i>`;
    text splits on whitespace and a word outside the vocabulary is `[UNK]`; a reply's words
    are joined by single spaces. The same tokenizer as `tokenizer_json()` loaded by the
    `tokenizers` package (tests/test_tokenizer_json.py holds the two equal), computed here
    without building its vocabulary: nothing to load at start-up, whatever the size."""

    def __init__(self, size: int):
        self.size = size
        self.name = f"words ({size})"

    def encode(self, text: str) -> list[int]:
        return [self._id(word) for word in WHITESPACE.split(text) if word]

    def _id(self, word: str) -> int:
        match = WORD.fullmatch(word)
        return int(match[1]) if match and int(match[1]) < self.size else 0

    def word(self, token: int) -> str:
        if not 0 <= token < self.size:
            return unknown(token)
        return f"w{token}" if token else UNK

    def decode(self, tokens: list[int]) -> str:
        return " ".join(self.word(t) for t in tokens)

    def stream(self) -> _WordStream:
        return _WordStream(self)

    def tokenizer_json(self) -> str:
        """This tokenizer as a tokenizer.json (`tokenizers`, transformers' fast tokenizers)."""
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers

        vocab = {UNK: 0, **{f"w{i}": i for i in range(1, self.size)}}
        tok = HFTokenizer(models.WordLevel(vocab, unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
        return tok.to_str()


class _WordStream:
    def __init__(self, tokenizer: WordTokenizer):
        self._tokenizer, self._first = tokenizer, True

    def step(self, token: int) -> str:
        word = self._tokenizer.word(token)
        if self._first:
            self._first = False
            return word
        return " " + word


def tokenizer_config(tokenizer: Tokenizer) -> str:
    """tokenizer_config.json: what transformers' AutoTokenizer needs beside tokenizer.json."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast"}
    if isinstance(tokenizer, WordTokenizer):
        config["unk_token"] = UNK
    return json.dumps(config)


def tokenizer_json(tokenizer: Tokenizer) -> str | None:
    """The tokenizer.json a client can load to tokenize as the server does; None for the
    byte-level tokenizer, which has none."""
    if isinstance(tokenizer, WordTokenizer):
        return tokenizer.tokenizer_json()
    if isinstance(tokenizer, FileTokenizer):
        return tokenizer._tok.to_str()
    return None


class _FileStream:
    def __init__(self, tokenizer: FileTokenizer):
        from tokenizers.decoders import DecodeStream

        self._tokenizer, self._decode = tokenizer, DecodeStream(skip_special_tokens=False)

    def step(self, token: int) -> str:
        if not 0 <= token < self._tokenizer.size:
            return unknown(token)
        return self._decode.step(self._tokenizer._tok, token) or ""


def tokenizer_path(tokenizer: str | None, checkpoint: str | None) -> Path | None:
    """The tokenizer.json a scenario names (a file, or a directory holding one), else its
    checkpoint's, else None (a built-in tokenizer)."""
    if tokenizer == BYTE_LEVEL:
        return None
    if tokenizer is not None:
        path = Path(tokenizer)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise TokenizerError(f"model.tokenizer: no tokenizer file at {path}")
        return path
    if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").is_file():
        return Path(checkpoint) / "tokenizer.json"
    return None


def tokenizer_for(tokenizer: str | None, checkpoint: str | None) -> Callable[[int], Tokenizer]:
    """What gives the server's tokenizer once the model's vocabulary size is known: a
    tokenizer.json's (read now, so a bad file fails before the worker starts), the
    byte-level one (`bytes`), or the default words of the vocabulary."""
    path = tokenizer_path(tokenizer, checkpoint)
    if path is not None:
        loaded = FileTokenizer(path)
        return lambda _size: loaded
    if tokenizer == BYTE_LEVEL:
        return lambda _size: ByteTokenizer()
    return WordTokenizer


def load_tokenizer(
    tokenizer: str | None = None, checkpoint: str | None = None, vocab_size: int = 0
) -> Tokenizer:
    """The tokenizer a server of this model would use (`tokenizer_for`)."""
    return tokenizer_for(tokenizer, checkpoint)(vocab_size)


def check_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> None:
    """Every id the tokenizer encodes to must be one the model has."""
    size = getattr(tokenizer, "size", BYTES)
    if size > vocab_size:
        raise TokenizerError(
            f"the tokenizer {tokenizer.name} has {size} tokens, more than the model's "
            f"vocabulary of {vocab_size}"
        )
