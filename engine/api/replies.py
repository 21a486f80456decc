"""The shapes of the OpenAI API's replies, for /v1/completions and /v1/chat/completions:
a streamed chunk per step's tokens, the final chunk with the finish reason and usage, and a
whole (non-streamed) reply. Both carry the token ids beside the text (`token_ids` on the
choice), which OpenAI clients ignore and the harness counts tokens by."""

from __future__ import annotations

import time
from dataclasses import dataclass


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Reply:
    """One request's reply: its id, model and creation time, in the endpoint's shape."""

    rid: int
    model: str
    chat: bool
    created: int = 0

    @classmethod
    def of(cls, rid: int, model: str, chat: bool) -> Reply:
        return cls(rid, model, chat, int(time.time()))

    def _head(self, whole: bool) -> dict:
        if self.chat:
            kind = "chat.completion" if whole else "chat.completion.chunk"
            return {"id": f"chatcmpl-{self.rid}", "object": kind}
        return {"id": f"cmpl-{self.rid}", "object": "text_completion"}

    def _event(self, choice: dict, whole: bool = False, **extra) -> dict:
        head = self._head(whole)
        return {**head, "created": self.created, "model": self.model, "choices": [choice], **extra}

    def chunk(self, text: str, tokens: list[int], logprobs: dict | None, first: bool) -> dict:
        """A streamed event with new tokens (the chat's first one also names the role)."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "token_ids": tokens, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "token_ids": tokens, "finish_reason": None}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        return self._event(choice)

    def final(self, finish: str, counts: dict) -> dict:
        """The last streamed event: no token, the finish reason and the usage."""
        body = {"delta": {}} if self.chat else {"text": ""}
        choice = {"index": 0, **body, "token_ids": [], "finish_reason": finish}
        return self._event(choice, usage=counts)

    def whole(
        self, text: str, tokens: list[int], logprobs: dict | None, finish: str, counts: dict
    ) -> dict:
        """A non-streamed reply."""
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "token_ids": tokens, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "token_ids": tokens, "finish_reason": finish}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        return self._event(choice, whole=True, usage=counts)
