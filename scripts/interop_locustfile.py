"""Locust (PyPI: `locust`) against the engine: streamed /v1/completions from N simulated users,
each reply checked against the protocol (docs/INTEROP.md).

    locust -f scripts/interop_locustfile.py --headless -u 4 -r 4 -t 10s \
      --host http://127.0.0.1:8000 --only-summary

Each user posts a streaming completion (`ignore_eos`, so every reply is `max_tokens` long) and
reads its server-sent events: a reply whose token count (the `token_ids` the engine streams, or
one a text chunk where a server sends none) differs from `usage.completion_tokens` or from
max_tokens, whose stream lacks `[DONE]`, or whose status is not 200 is a failure in Locust's
table. Beside the request's own row two rows of Locust's kind: "TTFT" (time to the first token,
ms) and "TOKENS" (each reply's end-to-end time, its length the tokens it counted), so Locust's
summary shows the time to first token's percentiles and the tokens delivered.

ENGINE_PROMPT and ENGINE_MAX_TOKENS (default "w1 w2 w3" and 16) set the request.
"""

from __future__ import annotations

import json
import os
import time

from locust import HttpUser, constant, task

PROMPT = os.environ.get("ENGINE_PROMPT", "w1 w2 w3")
MAX_TOKENS = int(os.environ.get("ENGINE_MAX_TOKENS", "16"))


class StreamedCompletions(HttpUser):
    wait_time = constant(0)  # a closed loop: each user sends its next request at once

    @task
    def completion(self) -> None:
        body = {
            "model": "qwen35", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        start = time.perf_counter()
        first, tokens, usage, done = None, 0, None, False
        with self.client.post(
            "/v1/completions", json=body, stream=True, catch_response=True, name="completions"
        ) as resp:
            if resp.status_code != 200:
                resp.failure(f"status {resp.status_code}")
                return
            for line in resp.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                usage = event.get("usage") or usage
                for choice in event.get("choices") or []:
                    ids = choice.get("token_ids")
                    count = len(ids) if ids is not None else int(bool(choice.get("text")))
                    if count and first is None:
                        first = time.perf_counter()
                    tokens += count
            said = (usage or {}).get("completion_tokens")
            if not done or tokens != MAX_TOKENS or said != tokens:
                resp.failure(f"tokens {tokens}, usage {said}, [DONE] {done}: not {MAX_TOKENS}")
                return
            resp.success()
        end = time.perf_counter()
        fire = self.environment.events.request.fire
        fire(request_type="TTFT", name="first token", response_time=(first - start) * 1e3,
             response_length=0, exception=None, context={})  # fmt: skip
        fire(request_type="TOKENS", name="completion tokens", response_time=(end - start) * 1e3,
             response_length=tokens, exception=None, context={})  # fmt: skip
