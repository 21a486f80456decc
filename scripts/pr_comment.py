"""Post a benchmark's comment on a pull request, or update the one already there: one comment
per pull request, however many runs (.github/workflows/bench-pr.yml; docs/REPORTS.md).

    python scripts/pr_comment.py --pr 42 --body results/pr/comment.md [--repo OWNER/NAME]

The body is `bench report RUN --github`'s comment.md, which ends with a hidden marker
(harness.show.report.github.MARKER); the pull request's comment holding the marker is edited
in place, else a new one is posted. Everything goes through `gh api` (GH_TOKEN in the
environment); the repository defaults to $GITHUB_REPOSITORY. Prints the comment's URL.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from harness.show.report.github import MARKER


def gh(*args: str) -> str:
    proc = subprocess.run(["gh", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gh {' '.join(args[:3])} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def pages(text: str) -> list[dict]:
    """`gh api --paginate`'s output: one JSON array per page, one after another."""
    decoder, items, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        page, at = decoder.raw_decode(text, at)
        items += page
        while at < len(text) and text[at].isspace():
            at += 1
    return items


def post_or_update(repo: str, pr: int, body: Path) -> dict:
    """The comment after the call: the marked one edited, or a new one."""
    if MARKER not in body.read_text():
        raise SystemExit(f"{body} has no {MARKER}: a second run could not find the comment")
    comments = pages(gh("api", "--paginate", f"repos/{repo}/issues/{pr}/comments"))
    marked = next((c for c in comments if MARKER in (c.get("body") or "")), None)
    field = f"body=@{body}"
    if marked is None:
        out = gh("api", "--method", "POST", f"repos/{repo}/issues/{pr}/comments", "-F", field)
    else:
        path = f"repos/{repo}/issues/comments/{marked['id']}"
        out = gh("api", "--method", "PATCH", path, "-F", field)
    return json.loads(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pr", type=int, required=True, help="the pull request's number")
    parser.add_argument("--body", type=Path, required=True, help="comment.md")
    parser.add_argument("--repo", default=os.environ.get("GITHUB_REPOSITORY"))
    args = parser.parse_args()
    if not args.repo:
        parser.error("give --repo OWNER/NAME (or set GITHUB_REPOSITORY)")
    if not args.body.is_file():
        parser.error(f"--body: no file at {args.body}")
    print(post_or_update(args.repo, args.pr, args.body).get("html_url", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
