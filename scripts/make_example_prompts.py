"""Writes scenarios/prompts/example.jsonl: a small prompt file of every form the load
generator reads (docs/LOADGEN.md), generated from a seed, nothing downloaded.

    python scripts/make_example_prompts.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "scenarios" / "prompts" / "example.jsonl"
WORDS = (
    "the a serving engine batch token prompt reply model cache page scheduler step request "
    "latency throughput stream decode prefill graph kernel queue worker client server "
    "measure compare faster slower window steady arrival rate burst tail median"
).split()
ASK = ["Explain", "Summarise", "Describe", "Compare", "List", "Why does"]


def sentence(rng: np.random.Generator, words: int) -> str:
    chosen = rng.choice(WORDS, size=words)
    return " ".join(chosen).capitalize() + "."


def main() -> None:
    rng = np.random.default_rng(2026)
    lines = []
    for i in range(24):
        ask = f"{ASK[i % len(ASK)]}: {sentence(rng, int(rng.integers(6, 40)))}"
        match i % 4:
            case 0 | 1:  # text with an output length
                lines.append({"prompt": ask, "output_tokens": int(rng.integers(16, 64))})
            case 2:  # token ids
                ids = rng.integers(0, 4096, int(rng.integers(16, 64))).tolist()
                lines.append({"prompt": ids, "output_tokens": int(rng.integers(16, 64))})
            case 3:  # ShareGPT-like: the reply's length sets the output length
                reply = sentence(rng, int(rng.integers(4, 12)))
                turns = [{"from": "human", "value": ask}, {"from": "gpt", "value": reply}]
                lines.append({"conversations": turns})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {OUT} ({len(lines)} prompts)")


if __name__ == "__main__":
    main()
