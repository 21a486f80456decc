"""The default tokenizer (engine/tokenizer.py WordTokenizer) is the tokenizer.json the server
serves, and a reply's streamed text re-tokenizes to the ids sent: with `tokenizers`, with
transformers' PreTrainedTokenizerFast, with the `openai` client (scripts/interop_openai.py)
under Locust, a third-party load tool from PyPI, and under `hey`, one from Debian (INVARIANTS 68;
docs/INTEROP.md)."""

from __future__ import annotations

import http.client
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from engine.tokenizer import WordTokenizer, tokenizer_config

ROOT = Path(__file__).resolve().parent.parent
SIZE = 300
WORDS = WordTokenizer(SIZE)
LIBRARY = Tokenizer.from_str(WORDS.tokenizer_json())
# text made of vocabulary words, near-words and every kind of whitespace the two might split on
PIECES = st.sampled_from(
    ["w1", "w7", "w299", "w300", "w07", "w", "[UNK]", "hello", "wé", "x", "12", "w1,", "##w3"]
)
SPACES = st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\u2003",
                          "\u3000", "\u200b", "\x1c", "\x1f", ""])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(PIECES, SPACES), max_size=12))
def test_the_default_encodes_any_text_as_its_tokenizer_json_does(parts):
    text = "".join(piece + space for piece, space in parts)
    assert WORDS.encode(text) == LIBRARY.encode(text, add_special_tokens=False).ids


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, SIZE - 1), max_size=40))
def test_streamed_text_re_tokenizes_to_the_ids_sent(ids):
    stream = WORDS.stream()
    text = "".join(stream.step(t) for t in ids)
    assert text == WORDS.decode(ids) == LIBRARY.decode(ids, skip_special_tokens=False)
    assert WORDS.encode(text) == ids == LIBRARY.encode(text, add_special_tokens=False).ids


def test_transformers_loads_the_served_files(tmp_path):
    transformers = pytest.importorskip("transformers")
    (tmp_path / "tokenizer.json").write_text(WORDS.tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(tokenizer_config(WORDS))
    fast = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert isinstance(fast, transformers.PreTrainedTokenizerFast)
    assert fast.encode("w5 w17 hello", add_special_tokens=False) == [5, 17, 0]
    assert fast.decode([5, 17, 0]) == "w5 w17 [UNK]"


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", path)
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp.status, body


@pytest.mark.slow
def test_the_server_serves_its_tokenizer_and_its_text_re_tokenizes(tiny_server):
    status, body = _get(tiny_server.port, "/v1/tokenizer.json")
    assert status == 200
    served = Tokenizer.from_str(body.decode())
    assert served.get_vocab_size() == 4096  # the tiny preset's vocabulary, a word an id
    status, config = _get(tiny_server.port, "/v1/tokenizer_config.json")
    assert status == 200 and json.loads(config)["tokenizer_class"] == "PreTrainedTokenizerFast"
    events = tiny_server.stream(prompt="w3 w4 w5", max_tokens=12, ignore_eos=True)
    text = "".join(e["choices"][0]["text"] for e in events)
    ids = [t for e in events for t in e["choices"][0].get("token_ids") or []]
    assert len(ids) == 12 == events[-1]["usage"]["completion_tokens"]
    assert events[-1]["usage"]["prompt_tokens"] == 3
    assert served.encode(text, add_special_tokens=False).ids == ids


@pytest.mark.slow
def test_the_openai_client_script_counts_what_usage_says(tiny_server):
    pytest.importorskip("openai")
    script = ROOT / "scripts" / "interop_openai.py"
    url = f"http://127.0.0.1:{tiny_server.port}"
    cmd = [sys.executable, str(script), url, "--requests", "3", "--max-tokens", "10"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(x["api"], x["tokens_counted"], x["agree"]) for x in lines] == [
        ("completions", 30, True),
        ("chat", 30, True),
    ]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("hey") is None, reason="hey: apt-get install hey")
def test_hey_drives_completions_without_an_error(tiny_server):
    """`hey` (Debian's HTTP load generator) at 4 in flight: every reply a 200 with its tokens."""
    body = json.dumps({"prompt": "w1 w2 w3", "max_tokens": 8, "ignore_eos": True})
    url = f"http://127.0.0.1:{tiny_server.port}/v1/completions"
    cmd = ["hey", "-n", "16", "-c", "4", "-m", "POST", "-T", "application/json", "-d", body, url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    codes = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", proc.stdout))
    assert codes == {"200": "16"}, proc.stdout


@pytest.mark.slow
def test_locust_streams_completions_and_every_reply_holds_the_protocol(tiny_server):
    """Locust (in the dev extra) with scripts/interop_locustfile.py: 4 users in a closed loop
    for 3 s, each streamed reply checked in the locustfile (its tokens 16, as `usage` says,
    ended by [DONE], a 200): no failure, and its TTFT and TOKENS rows count every reply."""
    # never imported here: importing locust monkey-patches the process (gevent) for good
    if importlib.util.find_spec("locust") is None:
        pytest.skip("locust: pip install locust (the dev extra has it)")
    cmd = ["locust", "-f", str(ROOT / "scripts" / "interop_locustfile.py"), "--headless",
           "-u", "4", "-r", "4", "-t", "3s", "--host", f"http://127.0.0.1:{tiny_server.port}",
           "--json", "--skip-log"]  # fmt: skip
    locust = shutil.which("locust") or str(Path(sys.executable).parent / "locust")
    proc = subprocess.run([locust, *cmd[1:]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = {row["method"]: row for row in json.loads(proc.stdout)}
    replies = rows["POST"]["num_requests"]
    assert replies >= 4 and rows["POST"]["num_failures"] == 0, rows["POST"]
    # a user cut by the run's end leaves a request unfinished: counted, never timed
    assert replies - 4 <= rows["TTFT"]["num_requests"] == rows["TOKENS"]["num_requests"] <= replies
    assert rows["TOKENS"]["total_content_length"] == 16 * rows["TOKENS"]["num_requests"]
