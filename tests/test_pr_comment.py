"""The pull request's comment: `bench report RUN --github` writes its body from the run's
Comparison (harness/show/report/github.py), and scripts/pr_comment.py, which the workflow
.github/workflows/bench-pr.yml calls, posts it through `gh` once and updates it on every later
run. Here a `gh` stand-in on PATH records each call and keeps the comments (INVARIANTS 69)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harness.cli import app
from harness.results import load_summary
from harness.show.report.document import HEADLINE_WORDS
from harness.show.report.github import MARKER
from tests.synthetic_run import RATES, write_run

ROOT = Path(__file__).resolve().parent.parent
ARTIFACT = "https://github.com/o/r/actions/runs/7/artifacts/9"
GH = '''#!/usr/bin/env python3
"""gh, as far as scripts/pr_comment.py uses it: `api` on one PR's comments."""
import json, os, sys
args = sys.argv[1:]
with open(os.environ["GH_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
state_file = os.environ["GH_STATE"]
comments = json.load(open(state_file))
path = next(a for a in args if a.startswith("repos/"))
method = args[args.index("--method") + 1] if "--method" in args else "GET"
if method == "GET":  # --paginate: one array per page, a comment a page
    print("".join(json.dumps([c]) for c in comments) or "[]")
    sys.exit(0)
body = open(args[args.index("-F") + 1].split("=@", 1)[1]).read()
if method == "POST":
    comment = {"id": 100 + len(comments), "body": body}
    comments.append(comment)
else:
    comment = next(c for c in comments if str(c["id"]) == path.rsplit("/", 1)[1])
    comment["body"] = body
comment["html_url"] = f"https://github.com/o/r/pull/5#issuecomment-{comment['id']}"
json.dump(comments, open(state_file, "w"))
print(json.dumps(comment))
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("pr") / "run"
    write_run(path, RATES)
    result = CliRunner().invoke(app, ["report", str(path), "--github", "--artifact-url", ARTIFACT])
    assert result.exit_code == 0, result.output
    return path


def test_the_comment_leads_with_the_headline_verdict_of_the_summary(run):
    body = (run / "comment.md").read_text()
    comparison = load_summary(run)
    verdict = comparison.headline_row.change.verdict
    first = body.splitlines()[0]
    assert first.startswith(f"**{HEADLINE_WORDS[verdict]}**")  # the summary's word, not re-judged
    assert "| figure |" in body and "| phase |" in body  # the verdict and phase tables
    assert f"[the run's artifact]({ARTIFACT})" in body and "`plots/throughput.png`" in body
    assert body.rstrip().endswith(MARKER) and body.count(MARKER) == 1
    assert len(body.splitlines()) < 60  # short: report.md holds the rest


def _post(run: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
           "GH_LOG": str(tmp_path / "gh.log"), "GH_STATE": str(tmp_path / "state.json"),
           "GITHUB_REPOSITORY": "o/r"}  # fmt: skip
    cmd = [sys.executable, str(ROOT / "scripts" / "pr_comment.py"), "--pr", "5",
           "--body", str(run / "comment.md")]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_the_script_posts_one_comment_and_a_second_run_updates_it(run, tmp_path):
    gh = tmp_path / "gh"
    gh.write_text(GH)
    gh.chmod(0o755)
    someone = {"id": 1, "body": "LGTM"}
    (tmp_path / "state.json").write_text(json.dumps([someone]))
    first = _post(run, tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().endswith("#issuecomment-101")
    (run / "comment.md").write_text((run / "comment.md").read_text().replace("Setup", "Set up"))
    second = _post(run, tmp_path)
    assert second.returncode == 0, second.stderr
    comments = json.loads((tmp_path / "state.json").read_text())
    assert [c["id"] for c in comments] == [1, 101] and comments[0] == someone
    assert "Set up:" in comments[1]["body"]  # the second run's body, in the first's comment
    calls = [json.loads(line) for line in (tmp_path / "gh.log").read_text().splitlines()]
    methods = [c[c.index("--method") + 1] if "--method" in c else "GET" for c in calls]
    assert methods == ["GET", "POST", "GET", "PATCH"]
    assert calls[1][3] == "repos/o/r/issues/5/comments"
    assert calls[3][3] == "repos/o/r/issues/comments/101"


def test_a_body_without_the_marker_is_refused_before_any_call(run, tmp_path):
    (tmp_path / "gh").write_text('#!/bin/sh\necho called >> "$GH_LOG"\n')
    (tmp_path / "gh").chmod(0o755)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "comment.md").write_text("no marker\n")
    proc = _post(plain, tmp_path)
    assert proc.returncode != 0 and "no <!-- bench-pr-report -->" in proc.stderr
    assert not (tmp_path / "gh.log").exists()


def test_the_workflow_runs_the_script_on_a_labelled_pr():
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "bench-pr.yml").read_text())
    assert workflow[True]["pull_request"]["types"] == ["labeled", "synchronize"]  # `on:`
    job = workflow["jobs"]["bench"]
    assert "self-hosted" in job["runs-on"] and "'bench'" in job["if"]
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert "bench run" in runs and "--abba" in runs and "--github" in runs
    assert "scripts/pr_comment.py" in runs and "GITHUB_STEP_SUMMARY" in runs
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in job["steps"])


def test_bad_report_options_are_one_line_errors(run):
    for args in (["--artifact-url", ARTIFACT], ["--github", "--artifact-url", "ftp://x"]):
        result = CliRunner().invoke(app, ["report", str(run), *args])
        assert result.exit_code == 2 and "artifact-url" in result.output
