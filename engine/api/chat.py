"""Chat messages to one prompt text: the ChatML template (Qwen's), the same for every
tokenizer (docs/ENGINE.md). A tokenizer.json carries no template of its own; a tokenizer
that knows `<|im_start|>` and `<|im_end|>` as special tokens encodes them as such, the
byte-level one as their bytes."""

from __future__ import annotations

import reprlib

ROLES = ("system", "user", "assistant", "developer")


def chat_prompt(messages: object) -> str:
    """`<|im_start|>role\\ncontent<|im_end|>\\n` per message, then the assistant's turn opened.
    Raises ValueError saying which message is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise ValueError(f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {reprlib.repr(role)}"
            )
        turns.append(f"<|im_start|>{role}\n{_content(message.get('content'), i)}<|im_end|>\n")
    return "".join(turns) + "<|im_start|>assistant\n"


def _content(content: object, i: int) -> str:
    """A string, or a list of text parts ({"type": "text", "text": ...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ValueError(
        f"messages[{i}].content must be a string or a list of text parts; "
        "images and audio are not supported"
    )
