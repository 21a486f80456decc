"""benchmarks/bench_startup.py: a real tiny server started, timed to its API's first answer,
/health 200 and its first token, and stopped with SIGTERM, with a fresh worker and with one
forked from a worker template; its "starting" line found in the log by its stamp; bad counts
refused."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks.bench_startup import main, starting_line_s


@pytest.mark.slow
@pytest.mark.fresh_worker  # the fresh worker is what it times; --template times the other
@pytest.mark.parametrize("template", [False, True])
def test_a_tiny_server_is_timed_from_launch_to_its_first_token_and_its_stop(
    template, tmp_path, capsys
):
    record = tmp_path / "starts.jsonl"
    assert main(["--starts", "2", "--json", str(record)] + ["--template"] * template) == 0
    out = capsys.readouterr().out
    how = "workers forked from a template" if template else "fresh workers"
    assert out.startswith(f"qwen35 tiny, 2 starts ({how}), seconds from the launch:")
    assert "worker ready (200)" in out and "first token" in out
    assert "exit codes after SIGTERM: [0]" in out
    starts = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(starts) == 2
    for start in starts:
        # the API logs "starting" before its worker is spawned, so before /health can answer;
        # it answers 503 before the worker is ready, and the first token comes after that
        assert 0 < start["starting_s"] < start["api_s"] <= start["ready_s"]
        assert start["ready_s"] < start["first_token_s"]
        assert start["exit_code"] == 0 and start["stop_s"] > 0 and start["template"] == template


def test_the_starting_line_is_read_by_its_stamp(tmp_path):
    log = tmp_path / "server.log"
    launched = time.mktime((2026, 12, 2, 16, 3, 23, 0, 0, -1))
    log.write_text(
        "some earlier line\n"
        "2026-12-02 16:03:23,513 engine.serve INFO starting scenario=qwen35 size=tiny\n"
        "2026-12-02 16:03:26,160 engine.serve INFO listening on http://127.0.0.1:8932\n"
    )
    assert starting_line_s(log, launched) == pytest.approx(0.513, abs=1e-6)
    (tmp_path / "none.log").write_text("no stamp here\n")
    assert starting_line_s(tmp_path / "none.log", launched) is None


@pytest.mark.parametrize(
    "args,message",
    [
        (["--starts", "0"], "must be >= 1, got 0"),
        (["--tree", "/nonexistent"], "no engine/serve.py"),
    ],
)
def test_bad_arguments_are_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
