"""bench measure, sweep and export: goodput as vLLM defines it, the saturation point, the
prompt file, vLLM's result keys, the summaries, and the commands end to end against
`bench mock` (a URL target: fast, no engine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis.export import records_frame, vllm_result
from harness.analysis.goodput import good, goodput, parse_slos
from harness.analysis.schema import RequestRecord
from harness.analysis.sweep import saturation
from harness.commands.schedule import redacted
from harness.commands.workload import headers
from harness.errors import BenchError, ExitCode
from harness.measure.prompt_file import read_prompt_file
from harness.measure.server import free_port

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "scenarios" / "prompts" / "example.jsonl"


def _request(index, send, first, end, tokens, ok=True) -> RequestRecord:
    times = [first + k * (end - first) / max(tokens - 1, 1) for k in range(tokens)]
    return RequestRecord(
        "a", "A", "A0", 0, 0, index, False, 8, tokens, send, send, first, end, tokens, times,
        200 if ok else 500, None if ok else "HTTP 500: no",
    )  # fmt: skip


def _frame(records) -> pd.DataFrame:
    return pd.DataFrame([r.__dict__ for r in records])


# ttft 0.1 s / tpot 0.01 s; ttft 0.3 s / tpot 0.01 s; ttft 0.1 s / tpot 0.05 s; a failure
REQUESTS = _frame(
    [
        _request(0, 0.0, 0.1, 0.19, 10),
        _request(1, 0.0, 0.3, 0.39, 10),
        _request(2, 1.0, 1.1, 1.55, 10),
        _request(3, 1.0, 1.1, 2.0, 10, ok=False),
    ]
)


def test_goodput_counts_requests_within_every_slo():
    assert parse_slos("ttft:200, tpot:20,e2el:1000") == {"ttft": 200, "tpot": 20, "e2e": 1000}
    for bad in ("", "ttft", "ttft:x", "ttft:-1", "itl:5"):
        with pytest.raises(ValueError):
            parse_slos(bad)
    assert good(REQUESTS, {"ttft": 200}).tolist() == [True, False, True]
    assert good(REQUESTS, {"ttft": 200, "tpot": 20}).tolist() == [True, False, False]
    g = goodput(REQUESTS, {"ttft": 200, "tpot": 20})
    assert (g.good, g.measured, g.share) == (1, 4, 0.25)
    assert g.per_s == pytest.approx(1 / 2.0)  # the measured run: first send 0 to last end 2


def test_saturation_is_where_more_load_stops_paying():
    assert saturation([1, 2, 4, 8], [100, 200, 390, 420]) == 4  # 4 -> 8: +8% for +100%
    assert saturation([1, 2, 4], [100, 200, 400]) is None
    assert saturation([1, 2, 4], [100, None, 400]) is None  # a missing point decides nothing


def test_vllm_result_has_its_keys_and_figures():
    manifest = {"concurrency": 2, "scenario": {"name": "m"}, "load": {"mode": "closed"}}
    out = vllm_result(manifest, REQUESTS, {"ttft": 200})
    for key in (
        "duration completed total_input_tokens total_output_tokens request_throughput "
        "request_goodput output_throughput total_token_throughput input_lens output_lens "
        "ttfts itls errors max_concurrency request_rate"
    ).split():
        assert key in out, key
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            assert f"{stat}_{metric}_ms" in out
    assert out["completed"] == 3 and out["num_prompts"] == 4 and out["duration"] == 2.0
    assert out["output_throughput"] == pytest.approx(30 / 2.0)
    assert out["mean_ttft_ms"] == pytest.approx((100 + 300 + 100) / 3)
    assert out["median_tpot_ms"] == pytest.approx(10)
    assert out["request_goodput"] == pytest.approx(2 / 2.0)
    assert out["output_lens"] == [10, 10, 10, 0] and out["errors"][3].startswith("HTTP 500")
    assert out["request_rate"] == "inf" and out["max_concurrent_requests"] == 2
    json.dumps(out, allow_nan=False)  # strict JSON
    rows = records_frame(REQUESTS)
    assert len(rows) == 4 and rows["ttft_ms"].iloc[1] == pytest.approx(300)
    assert json.loads(rows["token_times_s"].iloc[0])[0] == pytest.approx(0.1)


def test_prompt_files_text_ids_and_sharegpt(tmp_path):
    path = tmp_path / "p.jsonl"
    lines = [
        {"prompt": "hello there", "output_tokens": 5},
        {"prompt": [1, 2, 3], "max_tokens": 2},
        {"prompt": "guidellm's name", "output_tokens_count": 3},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "héllo wörld"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         "output_tokens": 7},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    prompts = read_prompt_file(path, count=7)
    specs = [prompts[i] for i in range(7)]
    assert [s.prompt for s in specs[:5]] == ["hello there", [1, 2, 3], "guidellm's name", "hi", "q"]
    assert [s.max_tokens for s in specs[:5]] == [5, 2, 3, 2, 7]  # the reply: 2 words, 2 tokens
    assert specs[5].prompt == "hello there" and specs[5].index == 5  # repeated, in order
    assert specs[1].prompt_tokens == 3 and specs[0].prompt_tokens == 0
    for bad in ('{"prompt": "x"}', '{"prompt": ""}', "[1]", '{"text": "x"}', "not json"):
        path.write_text(bad)
        with pytest.raises(BenchError, match="p.jsonl:1"):
            read_prompt_file(path, count=1)
    path.write_text('{"prompt": "x"}')
    assert read_prompt_file(path, 1, default_output=9)[0].max_tokens == 9


def test_the_example_prompt_file_reads():
    prompts = read_prompt_file(EXAMPLE, count=100)
    kinds = {type(p).__name__ for p in prompts.prompts}
    assert kinds == {"str", "list"} and len(prompts.prompts) >= 20


def test_the_preflight_reads_the_load_as_it_will_be_sent(tmp_path):
    """Fixed lengths and a prompt file's longest entry are what must fit; the closed loop's
    window is checked, the open loop's (its arrivals') is not."""
    from harness.commands.targets import arm_scenarios, vocab
    from harness.commands.workload import LoadOptions, workload
    from harness.measure.arms import resolve
    from harness.measure.preflight import preflight
    from harness.scenario import load_scenario

    scenario = load_scenario("qwen35", "tiny")
    arm = resolve("A", "a", "worktree")
    engines = arm_scenarios([arm], scenario)
    limit = engines["A"].engine.max_model_len

    def check(**options):
        load = workload(scenario, vocab(scenario), LoadOptions(**options))
        preflight(load.plan(scenario, {"A": arm}, ["A"], 1, 100, 1), engines)

    check(concurrency=4, input_len=limit - 8, output_len=8)
    with pytest.raises(BenchError, match=f"prompts up to {limit - 7} \\+ outputs up to 8"):
        check(concurrency=4, input_len=limit - 7, output_len=8)
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": [1] * 10, "output_tokens": 4}, {"prompt": [1] * 20}]  # --output-len
    prompts.write_text("\n".join(json.dumps(line) for line in lines))
    check(concurrency=1, prompts=prompts, output_len=8)
    with pytest.raises(BenchError, match="prompts up to 20 \\+ outputs up to 9999"):
        check(concurrency=1, prompts=prompts, output_len=9999)
    with pytest.raises(BenchError, match="no steady window at -c 64"):
        check(concurrency=64, requests=80, warmup=16)
    check(concurrency=64, requests=80, warmup=16, request_rate=5.0)  # open loop: not modelled


def test_headers_and_their_values_kept_out_of_the_manifest():
    assert headers(["Authorization: Bearer x", "X-A:1"]) == {
        "Authorization": "Bearer x",
        "X-A": "1",
    }
    with pytest.raises(BenchError):
        headers(["no-colon"])
    argv = ["bench", "measure", "--header", "Authorization:Bearer s3cret", "--header=X:y"]
    assert "s3cret" not in " ".join(redacted(argv)) and "Authorization:***" in redacted(argv)


def bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def mock_url():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "mock", "--port", str(port), "--ttft-ms", "20",
         "--itl-ms", "1"],
        cwd=ROOT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.slow
def test_bench_measure_a_url_with_slos_and_export(mock_url, tmp_path):
    out = tmp_path / "run"
    common = ["measure", mock_url, "-c", "4", "--requests", "24", "--warmup", "4"]
    common += ["--output-len", "8", "--header", "Authorization:Bearer s3cret"]
    missed = bench(*common, "--goodput", "ttft:1", "--out", str(out), "--json", cwd=tmp_path)
    assert missed.returncode == 1, missed.stderr  # TTFT is 20 ms: the SLO is missed
    summary = json.loads(missed.stdout)
    assert summary["kind"] == "measure" and summary["slo_missed"]
    assert summary["goodput"]["good"] == 0 and summary["requests"] == 24
    assert "s3cret" not in (out / "manifest.json").read_text()
    again = bench(*common, "--out", str(out))  # one run per directory, as bench run's
    assert again.returncode == 2 and "already holds a run; give --overwrite" in again.stderr
    met = bench(*common, "--goodput", "ttft:5000", cwd=tmp_path)
    assert met.returncode == 0, met.stderr
    assert "SLO met" in met.stdout
    assert len(list((tmp_path / "results").iterdir())) == 1  # under the current directory
    exported = bench("export", str(out), "--format", "vllm")
    assert exported.returncode == 0, exported.stderr
    vllm = json.loads((out / "vllm.json").read_text())
    assert vllm["completed"] == 24 and vllm["median_ttft_ms"] > 19
    assert bench("export", str(out), "--format", "csv").returncode == 0
    assert len(pd.read_csv(out / "requests.csv")) == 28
    report = bench("report", str(out))
    assert report.returncode == 0 and "Measurement" in (out / "report.md").read_text()


@pytest.mark.slow
def test_a_sweep_of_two_arms(mock_url, tmp_path):
    """The same sweep for two arms (here two URLs: the mock twice), A B then B A."""
    out = tmp_path / "sweep"
    proc = bench(
        "sweep", "qwen35", "--arm", f"a={mock_url}", "--arm", f"b={mock_url}",
        "--rates", "50,100", "-c", "16", "--requests", "24", "--warmup", "2",
        "--output-len", "4", "--out", str(out), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["labels"] == {"A": "a", "B": "b"}
    assert [(p["letter"], p["load"]) for p in summary["points"]] == [
        ("A", 50), ("A", 100), ("B", 50), ("B", 100),
    ]  # fmt: skip
    schedule = json.loads((out / "manifest.json").read_text())["schedule"]
    assert schedule == ["A", "B", "B", "A"]
    assert set(summary["saturation"]) == {"A", "B"}
    assert bench("report", str(out)).returncode == 0 and (out / "sweep.png").is_file()


@pytest.mark.slow
def test_a_sweep_under_a_time_budget_ends_between_loads(mock_url, tmp_path):
    """`bench sweep --time-budget`: a load starts only while the time so far plus the longest
    load yet fits; with a budget the first load fills, one of three runs and the curve is of
    that one, the run complete (exit 0) and the doubts saying why."""
    out = tmp_path / "sweep"
    proc = bench(
        "sweep", mock_url, "--concurrencies", "1,2,4", "--requests", "16", "--warmup", "2",
        "--output-len", "64", "--time-budget", "1", "--out", str(out), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert [p["load"] for p in summary["points"]] == [1]
    assert any("after 1 of 3 load points" in doubt for doubt in summary["doubts"])
    assert json.loads((out / "manifest.json").read_text())["complete"]


@pytest.mark.slow
def test_bench_sweep_and_usage_errors(mock_url, tmp_path):
    out = tmp_path / "sweep"
    proc = bench(
        "sweep", mock_url, "--concurrencies", "1,4", "--requests", "16", "--warmup", "4",
        "--output-len", "4", "--out", str(out), "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["kind"] == "sweep" and [p["load"] for p in summary["points"]] == [1, 4]
    assert (out / "sweep.png").is_file()
    assert summary["points"][1]["output_tok_per_s"] > summary["points"][0]["output_tok_per_s"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["concurrency"] == 4  # the most in flight at any point, not a placeholder
    assert manifest["load"] == {
        "mode": "closed",
        "per_point": ["concurrency"],
        "api": "completions",
    }
    for args in (
        ["measure", mock_url, "-c", "2", "--goodput", "latency:5"],
        ["measure", mock_url],  # neither -c nor --request-rate
        ["sweep", mock_url, "--rates", "1,x"],
        ["export", str(out), "--format", "xml"],
        ["run", "qwen35", "-c", "2", "--arm", "a=nonexistent-ref-xyz", "--arm", "b=worktree"],
    ):
        proc = bench(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "error:" in proc.stderr


@pytest.mark.slow
def test_bench_measure_a_scenario_open_loop_with_spans(tmp_path):
    """A fresh engine, driven in the open loop with text prompts from the example file as chat
    completions: the records, the spans, the summary and the report."""
    out = tmp_path / "run"
    proc = bench(
        "measure", "qwen35", "--size", "tiny", "--request-rate", "20", "-c", "16",
        "--prompts", str(EXAMPLE), "--output-len", "8", "--requests", "24", "--warmup", "2",
        "--period", "10", "--out", str(out), "--json", "--report",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["load"] == {
        "mode": "open",
        "request_rate": 20.0,
        "burstiness": 1.0,
        "max_in_flight": 16,
        "api": "completions",
    }
    assert summary["failed"] == 0 and summary["requests"] == 24
    assert summary["phases"] and not [d for d in summary["doubts"] if "spans" in d]
    frames = pd.read_parquet(out / "requests.parquet")
    assert (frames["prompt_tokens"] > 0).all()  # text prompts: counted from usage
    assert (out / "report.md").is_file()


def test_arms_resolve_in_the_repository_of_the_current_directory(tmp_path, monkeypatch):
    from harness.measure import arms

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "f").write_text("x")
    git("add", "f")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True
    ).stdout.strip()
    monkeypatch.chdir(tmp_path)
    assert arms.repo() == tmp_path.resolve()
    arm = arms.resolve("B", "mine", "worktree")
    assert arm.commit == head and arm.tree == str(tmp_path.resolve()) and not arm.dirty
    assert arms.resolve("A", "base", "HEAD").commit == head
    monkeypatch.chdir(tmp_path.parent)  # outside any repository: bench's own tree
    assert arms.repo() in (arms.HARNESS_TREE, Path(tmp_path.parent).resolve())


def test_a_dir_arm_runs_another_trees_engine_and_names_its_code(tmp_path):
    """`dir:PATH`: the engine of a tree on disk (a commit's `git archive` where the history is
    not at hand): its servers run from that tree, the arm named by a hash of its engine code,
    so two copies of one engine are the same code and an edit is not; a path with no engine
    is a one-line error before anything runs."""
    import shutil

    from harness.measure import arms

    one, two = tmp_path / "one", tmp_path / "two"
    for tree in (one, two):
        shutil.copytree(ROOT / "engine", tree / "engine", ignore=shutil.ignore_patterns("*.pyc"))
    a, b = arms.resolve("A", "old", f"dir:{one}"), arms.resolve("B", "copy", f"dir:{two}")
    assert (a.kind, a.tree, a.commit) == ("dir", str(one.resolve()), None)
    assert a.same_code_as(b) and not a.same_code_as(arms.resolve("B", "new", "worktree"))
    with (two / "engine" / "spans.py").open("a") as edited:
        edited.write("# an edit\n")
    assert not a.same_code_as(arms.resolve("B", "edited", f"dir:{two}"))
    with pytest.raises(BenchError, match="holds no engine"):
        arms.resolve("A", "none", f"dir:{tmp_path / 'none'}")
    refused = bench("run", "qwen35", "--arm", f"a=dir:{tmp_path / 'none'}", "--arm", "b=worktree")
    assert refused.returncode == 2 and "holds no engine" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_crash_exits_3_not_1(monkeypatch, tmp_path, capsys):
    """1 says "B is slower"; a bug must not read as a verdict."""
    from harness import cli
    from harness.commands import export

    def broken(path):
        raise RuntimeError("a bug")

    monkeypatch.setattr(export, "load_run", broken)
    monkeypatch.setattr(sys, "argv", ["bench", "export", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == ExitCode.INTERNAL == 3
    assert "RuntimeError: a bug" in capsys.readouterr().err


def test_every_exit_code_is_in_the_one_table():
    """docs/RELIABILITY.md's table is where the exit codes are written down, all of them."""
    text = (ROOT / "docs" / "RELIABILITY.md").read_text()
    table = text[text.index("## Exit codes") : text.index("## Harness faults")]
    documented = {int(code) for code in re.findall(r"^\| `(\d+)` \|", table, re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}


def test_a_slot_that_measured_no_request_is_failed_not_skipped():
    """Issue 34 (no silent pass): a load that got only its warmup requests out measured
    nothing; its slot fails (exit 4) with what to do."""
    from dataclasses import replace as copy_with

    from harness.measure.watch import Watch

    warm = [copy_with(_request(i, 0.0, 0.1, 0.2, 4), warmup=True) for i in range(3)]
    fault = Watch(None, 10.0).fault(warm)
    assert fault.startswith("0 measured requests (3 warmup requests sent)")
    assert "give more --requests or a longer --duration" in fault
    assert Watch(None, 10.0).fault([*warm, _request(3, 0.0, 0.1, 0.2, 4)]) is None
