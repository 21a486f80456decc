"""Drive an engine with the official `openai` client and count its replies' tokens as a
third-party tool does: by tokenizing the streamed text with the tokenizer the server serves
(GET /v1/tokenizer.json). Prints one line per endpoint; exits 1 when a count disagrees with
the token ids sent or with `usage` (docs/INTEROP.md).

    python scripts/interop_openai.py http://127.0.0.1:8000 [--requests 8] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request


def served_tokenizer(url: str):
    from tokenizers import Tokenizer

    with urllib.request.urlopen(f"{url}/v1/tokenizer.json", timeout=60) as resp:
        return Tokenizer.from_str(resp.read().decode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    url = args.url.rstrip("/")

    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    tokenizer = served_tokenizer(url)
    extra = {"ignore_eos": True}
    bad = 0
    for api in ("completions", "chat"):
        counted = usage = sent = 0
        for i in range(args.requests):
            text, ids, used = "", [], None
            if api == "completions":
                stream = client.completions.create(
                    model=model, prompt=f"w{i + 1} w7 w9", max_tokens=args.max_tokens,
                    stream=True, stream_options={"include_usage": True}, extra_body=extra,
                )  # fmt: skip
            else:
                stream = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": f"w{i + 1} w7"}],
                    max_completion_tokens=args.max_tokens, stream=True,
                    stream_options={"include_usage": True}, extra_body=extra,
                )  # fmt: skip
            for chunk in stream:
                used = chunk.usage or used
                for choice in chunk.choices:
                    piece = choice.text if api == "completions" else choice.delta.content
                    text += piece or ""
                    ids += (choice.model_extra or {}).get("token_ids") or []
            retokenized = tokenizer.encode(text, add_special_tokens=False).ids
            bad += retokenized != ids
            counted, usage, sent = (
                counted + len(retokenized),
                usage + used.completion_tokens,
                sent + len(ids),
            )
        agree = counted == usage == sent
        bad += not agree
        print(json.dumps({"api": api, "requests": args.requests, "tokens_counted": counted,
                          "usage_completion_tokens": usage, "token_ids_sent": sent,
                          "agree": agree}))  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
