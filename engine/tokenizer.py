"""Text in, token ids out, and back: the API server's tokenizer (docs/ENGINE.md, Text).

A `tokenizer.json` (the `tokenizers` package) when the scenario names one
(`model.tokenizer`) or the checkpoint directory (`model.path`) holds one; otherwise the
built-in byte-level tokenizer: token id b < 256 is the byte b, so a text is its UTF-8 bytes,
one token each, and an id from 256 up (which no text encodes to) renders as `<id>`. Either
way a reply's text is decoded as it streams (`Tokenizer.stream`), holding back the bytes of
a character split across tokens, and usage counts tokens, never characters.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Protocol

BYTES = 256


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
    checkpoint's, else None (the byte-level tokenizer)."""
    if tokenizer is not None:
        path = Path(tokenizer)
        path = path / "tokenizer.json" if path.is_dir() else path
        if not path.is_file():
            raise TokenizerError(f"model.tokenizer: no tokenizer file at {path}")
        return path
    if checkpoint is not None and (Path(checkpoint) / "tokenizer.json").is_file():
        return Path(checkpoint) / "tokenizer.json"
    return None


def load_tokenizer(tokenizer: str | None = None, checkpoint: str | None = None) -> Tokenizer:
    path = tokenizer_path(tokenizer, checkpoint)
    return ByteTokenizer() if path is None else FileTokenizer(path)


def check_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> None:
    """Every id the tokenizer encodes to must be one the model has."""
    size = getattr(tokenizer, "size", BYTES)
    if size > vocab_size:
        raise TokenizerError(
            f"the tokenizer {tokenizer.name} has {size} tokens, more than the model's "
            f"vocabulary of {vocab_size}"
        )
