"""Text and chat: the tokenizers (built-in byte-level and a tokenizer.json), the chat template,
validation of chat bodies, and the official `openai` client streaming completions and chat
completions from the engine with text prompts (INVARIANTS 39: the worker sees token ids only,
usage counts tokens)."""

from __future__ import annotations

import json

import pytest

from engine.api.chat import chat_prompt
from engine.api.validate import ApiError, Limits, validate_chat, validate_completion
from engine.tokenizer import (
    ByteTokenizer,
    FileTokenizer,
    TokenizerError,
    WordTokenizer,
    check_vocabulary,
    load_tokenizer,
    tokenizer_path,
)
from harness.measure.server import ServerProcess
from tests.conftest import Api
from tests.word_tokenizer import word_tokenizer

VOCAB = 4096  # the tiny preset's


def test_byte_tokenizer_round_trips_text_and_streams_whole_characters():
    tok = ByteTokenizer()
    text = "Grüße, 世界!"
    ids = tok.encode(text)
    assert ids == list(text.encode()) and max(ids) < 256
    assert tok.decode(ids) == text
    stream = tok.stream()
    pieces = [stream.step(t) for t in ids]
    assert "".join(pieces) == text
    # the bytes of one character come out together, on its last byte
    assert pieces[2:4] == ["", "ü"]
    assert tok.decode([104, 300, 105]) == "h<300>i"  # ids past the bytes read as <id>
    assert tok.decode([0xC3]) == "\ufffd"  # an unfinished character at the end


def test_file_tokenizer_encodes_decodes_and_streams(tmp_path):
    path = word_tokenizer(tmp_path, 64)
    tok = FileTokenizer(path)
    assert tok.size == 64
    ids = tok.encode("w3 w7 hello")
    assert ids == [3, 7, 0]  # "hello" is unknown: [UNK] is id 0
    stream = tok.stream()
    assert [stream.step(t) for t in [3, 7, 100]] == ["w3", " w7", "<100>"]
    assert tok.decode([3, 7]) == "w3 w7"


def test_which_tokenizer_a_scenario_gets(tmp_path):
    assert tokenizer_path(None, None) is None
    default = load_tokenizer(vocab_size=VOCAB)  # the words of the model's vocabulary
    assert isinstance(default, WordTokenizer) and default.size == VOCAB
    assert isinstance(load_tokenizer("bytes"), ByteTokenizer)
    path = word_tokenizer(tmp_path, 16)
    assert tokenizer_path(str(path), None) == path
    assert tokenizer_path(str(tmp_path), None) == path  # a directory holding tokenizer.json
    assert tokenizer_path(None, str(tmp_path)) == path  # the checkpoint's own
    with pytest.raises(TokenizerError, match="no tokenizer file"):
        tokenizer_path(str(tmp_path / "missing.json"), None)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read"):
        load_tokenizer(str(tmp_path / "bad.json"))
    with pytest.raises(TokenizerError, match="more than the model's"):
        check_vocabulary(FileTokenizer(path), 8)
    with pytest.raises(TokenizerError):
        check_vocabulary(ByteTokenizer(), 100)


def test_chat_template_is_chatml():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    assert chat_prompt(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


LIMITS = Limits(VOCAB, 256, "m")
USER = [{"role": "user", "content": "hi"}]
BAD_CHAT = [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": USER, "max_tokens": 4, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"messages": USER, "max_tokens": 1000}, "max_tokens"),
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": USER, "logprobs": True}, "logprobs"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
    ({"messages": USER, "prompt": "x"}, "prompt"),
    ({"messages": USER, "temperature": -1}, "temperature"),
]


@pytest.mark.parametrize("body,param", BAD_CHAT, ids=[p for _, p in BAD_CHAT])
def test_bad_chat_bodies_name_the_field(body, param):
    with pytest.raises(ApiError) as err:
        validate_chat(body, LIMITS)
    assert err.value.status == 400 and err.value.param == param


def test_text_prompts_are_tokenized_and_counted_in_tokens():
    params = validate_completion({"prompt": "héllo", "max_tokens": 2}, LIMITS)
    assert params.prompt == list("héllo".encode())
    chat = validate_chat({"messages": USER, "max_completion_tokens": 3}, LIMITS)
    assert chat.prompt == list(chat_prompt(USER).encode()) and chat.max_tokens == 3
    for prompt in ("", ["a", "b"]):
        with pytest.raises(ApiError) as err:
            validate_completion({"prompt": prompt}, LIMITS)
        assert err.value.param == "prompt"


def _openai(port: int):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


def _streamed(stream) -> tuple[list, object]:
    chunks, usage = [], None
    for chunk in stream:
        chunks += chunk.choices
        usage = chunk.usage or usage
    return chunks, usage


@pytest.mark.slow
def test_openai_client_streams_completions_and_chat(tiny_server):
    client = _openai(tiny_server.port)
    prompt = "The quick brown fox"
    extra = {"ignore_eos": True}
    choices, usage = _streamed(
        client.completions.create(
            model="qwen35", prompt=prompt, max_tokens=6, stream=True, extra_body=extra
        )
    )
    words = WordTokenizer(VOCAB)  # the server's default: a word a token
    assert usage.prompt_tokens == 4 and usage.completion_tokens == 6
    assert choices[-1].finish_reason == "length" and "".join(c.text for c in choices)
    choices, usage = _streamed(
        client.chat.completions.create(
            model="qwen35",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    assert choices[0].delta.role == "assistant" and choices[-1].finish_reason == "length"
    assert usage.completion_tokens == 5
    assert usage.prompt_tokens == len(
        words.encode(chat_prompt([{"role": "user", "content": prompt}]))
    )
    whole = client.chat.completions.create(
        model="qwen35", messages=[{"role": "user", "content": prompt}], max_completion_tokens=3
    )
    assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens <= 3
    with pytest.raises(Exception, match="400") as err:
        client.chat.completions.create(model="qwen35", messages=[{"role": "user", "content": 1}])
    assert "messages" in str(err.value)


@pytest.mark.slow
def test_a_tokenizer_json_names_the_tokens(tmp_path):
    """A scenario naming a tokenizer.json: prompts count its tokens, replies read as its
    words, streamed and whole alike."""
    path = word_tokenizer(tmp_path, VOCAB)
    overrides = f"model.tokenizer={path},engine.max_rows=8,engine.kv_pages=256"
    with ServerProcess("qwen35", size="tiny", overrides=overrides) as server:
        api = Api(server.port)
        body = {"prompt": "w1 w2 w3 w4", "max_tokens": 4, "ignore_eos": True, "temperature": 0}
        status, whole = api.complete(**body)
        assert status == 200 and whole["usage"]["prompt_tokens"] == 4
        ids = whole["choices"][0]["token_ids"]
        assert whole["choices"][0]["text"] == " ".join(f"w{t}" for t in ids)
        events = api.stream(**body)
        assert "".join(e["choices"][0]["text"] for e in events) == whole["choices"][0]["text"]
        assert events[-1]["usage"] == whole["usage"]
        raw = json.dumps({"messages": [{"role": "user", "content": "w5"}], "max_tokens": 2})
        status, chat = api.request("POST", "/v1/chat/completions", raw.encode())
        assert status == 200 and chat["object"] == "chat.completion"
