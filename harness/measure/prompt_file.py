"""A prompt file: one JSON object per line, read into a `PromptList` (docs/LOADGEN.md).

    {"prompt": "text" or [token ids], "output_tokens": N}
    {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}

`output_tokens` may also be spelled `max_tokens` or `output_tokens_count` (GuideLLM's name, so
one file drives both). A ShareGPT-like line (`conversations` or `messages`, turns with
`from`/`value` or `role`/`content`) sends its first user turn as the prompt; without an
output length of its own it asks for as many tokens as its first reply has, counted with the
tokenizer given (a tokenizer.json, or `bytes`), else as the engine's default tokenizer does
(a token per word, whatever the vocabulary). A line with neither
takes `default_output`. Nothing is downloaded: the file is read from disk, once.
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from harness.errors import BenchError
from harness.measure.request_sequence import PromptList

LENGTH_KEYS = ("output_tokens", "max_tokens", "output_tokens_count")
USER, REPLY = ("human", "user"), ("gpt", "assistant", "model", "chatgpt", "bing", "bard")


def read_prompt_file(
    path: Path, count: int, default_output: int | None = None, tokenizer: str | None = None
) -> PromptList:
    """`count` requests from the file at `path` (its entries in order, repeated)."""
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
        counter = load_tokenizer(tokenizer)
    except (OSError, TokenizerError) as exc:
        raise BenchError(f"cannot read the prompt file: {exc}") from None
    prompts, lengths = [], []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise BenchError(f"{where}: not JSON ({exc})") from None
        if not isinstance(entry, dict):
            raise BenchError(f"{where}: each line must be a JSON object")
        prompt, length = _entry(entry, counter, default_output, where)
        prompts.append(prompt)
        lengths.append(length)
    if not prompts:
        raise BenchError(f"{path} holds no prompts")
    return PromptList(prompts, lengths, count)


def _entry(entry: dict, counter: Tokenizer, default: int | None, where: str):
    length = next((entry[k] for k in LENGTH_KEYS if k in entry), None)
    turns = entry.get("conversations", entry.get("messages"))
    if "prompt" in entry:
        prompt = entry["prompt"]
    elif isinstance(turns, list):
        texts = [(_speaker(t), _said(t)) for t in turns if isinstance(t, dict)]
        prompt = next((text for who, text in texts if who in USER), None)
        reply = next((text for who, text in texts if who in REPLY), None)
        if length is None and reply:
            length = max(1, len(counter.encode(reply)))
    else:
        raise BenchError(f"{where}: give a prompt, or conversations (ShareGPT-like)")
    text = isinstance(prompt, str) and prompt
    ids = isinstance(prompt, list) and prompt and all(_is_token(t) for t in prompt)
    if not (text or ids):
        raise BenchError(f"{where}: the prompt must be a non-empty text or list of token ids")
    length = default if length is None else length
    if not _is_token(length) or length < 1:
        raise BenchError(
            f"{where}: no output length (output_tokens >= 1); give one, or --output-len"
        )
    return prompt, length


def _speaker(turn: dict) -> str:
    return str(turn.get("from", turn.get("role", ""))).lower()


def _said(turn: dict) -> str | None:
    said = turn.get("value", turn.get("content"))
    return said if isinstance(said, str) else None


def _is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
