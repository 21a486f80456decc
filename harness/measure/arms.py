"""Arms: what each side of a comparison runs, resolved to something a server can start from.

A SPEC is a git ref (run from a worktree of that commit), `worktree` (this tree, uncommitted
changes included), scenario overrides (`key=value,...`, on this tree), `dir:PATH` (the engine
of another tree on disk, e.g. a commit's `git archive` on a machine without the repository's
history), or the URL of a running OpenAI-compatible server (driven as is: no spans).
Default: A = the merge-base of HEAD with main, B = the working tree. "This tree" and the refs
are those of the git repository of the current directory (`repo()`), wherever bench itself is
installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import BenchError
from harness.scenario import ConfigError, parse_overrides

HARNESS_TREE = Path(__file__).resolve().parents[2]  # the checkout bench runs from


def repo() -> Path:
    """The git repository of the current directory; outside one, the harness's own tree."""
    proc = subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, cwd=Path.cwd()
    )
    return Path(proc.stdout.strip()) if proc.returncode == 0 else HARNESS_TREE


@dataclass(frozen=True)
class Arm:
    letter: str  # "A" or "B": its place in the schedule
    name: str  # what the user called it
    kind: str  # "ref" | "worktree" | "overrides" | "dir" | "url"
    spec: str
    commit: str | None = None
    dirty: bool = False
    diff_hash: str | None = None
    overrides: dict = field(default_factory=dict)
    url: str | None = None
    tree: str | None = None  # the directory `python -m engine serve` runs from

    def manifest(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}

    def same_code_as(self, other: Arm) -> bool:
        return (
            self.kind != "url"
            and other.kind != "url"
            and self.commit == other.commit
            and self.diff_hash == other.diff_hash
            and self.overrides == other.overrides
        )


def git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd or repo(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"git {' '.join(args)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip()


def git_or_none(*args: str) -> str | None:
    """A git query that may fail (an unknown ref, no checkout): its output, or None."""
    proc = subprocess.run(["git", *args], cwd=repo(), capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _tree_state() -> tuple[str | None, bool, str | None]:
    """HEAD, whether the tree differs from it, and a hash of the difference (all unknown
    outside a git checkout, e.g. a copied tree on a remote machine)."""
    head = git_or_none("rev-parse", "HEAD")
    if head is None:
        return None, False, None
    root = repo()
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=root, capture_output=True).stdout
    untracked = git("ls-files", "--others", "--exclude-standard", cwd=root)
    if not diff and not untracked:
        return head, False, None
    digest = hashlib.sha256(diff)
    for name in sorted(untracked.splitlines()):
        digest.update(name.encode())
        path = root / name
        if path.is_file():
            digest.update(path.read_bytes())
    return head, True, digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bench" / "worktrees"


def _worktree_for(commit: str) -> Path:
    path = cache_dir() / commit
    if not (path / "engine").is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "prune"], cwd=repo(), capture_output=True)
        git("worktree", "add", "--force", "--detach", str(path), commit)
    return path


def default_base() -> str:
    """The merge-base of HEAD with main, or the first commit when there is no main."""
    for main in ("main", "origin/main", "master"):
        if git_or_none("rev-parse", "--verify", "--quiet", main) is not None:
            return git("merge-base", "HEAD", main)
    return git("rev-list", "--max-parents=0", "HEAD").splitlines()[-1]


def _engine_digest(tree: Path) -> str:
    """A hash of a tree's engine code (every file under engine/, by path and bytes): what a
    dir arm runs, so two dir arms of the same code read as the same code."""
    digest = hashlib.sha256()
    for path in sorted((tree / "engine").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(tree)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def resolve(letter: str, name: str, spec: str) -> Arm:
    spec = spec.strip()
    if spec.startswith(("http://", "https://")):
        return Arm(letter, name, "url", spec, url=spec.rstrip("/"))
    if spec.startswith("dir:"):
        tree = Path(spec.removeprefix("dir:")).expanduser().resolve()
        if not (tree / "engine" / "__init__.py").is_file():
            raise BenchError(
                f"arm {name}: {spec!r} holds no engine ({tree}/engine/__init__.py); give a "
                "tree such as a commit's `git archive`, unpacked"
            )
        return Arm(letter, name, "dir", spec, diff_hash=_engine_digest(tree), tree=str(tree))
    if spec == "worktree":
        head, dirty, digest = _tree_state()
        return Arm(letter, name, "worktree", spec, head, dirty, digest, tree=str(repo()))
    if "=" in spec:
        try:
            overrides = parse_overrides(spec)
        except ConfigError as exc:
            raise BenchError(str(exc)) from None
        head, dirty, digest = _tree_state()
        tree = str(repo())
        return Arm(letter, name, "overrides", spec, head, dirty, digest, overrides, tree=tree)
    commit = git_or_none("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    if commit is None:
        raise BenchError(
            f"arm {name}: git ref {spec!r} does not resolve; try a branch, tag or "
            "commit (git log --oneline)"
        )
    head, dirty, _ = _tree_state()
    tree = repo() if commit == head and not dirty else _worktree_for(commit)
    return Arm(letter, name, "ref", spec, commit, tree=str(tree))


def parse_arm_option(text: str) -> tuple[str, str]:
    name, sep, spec = text.partition("=")
    if not sep or not name or not spec:
        raise BenchError(f"--arm {text!r} must be NAME=SPEC, e.g. --arm base=main")
    return name, spec


def resolve_arms(options: list[str]) -> tuple[Arm, Arm]:
    if not options:
        base = default_base()
        return resolve("A", "base", base), resolve("B", "worktree", "worktree")
    if len(options) != 2:
        raise BenchError(f"give two --arm options (A then B) or none; got {len(options)}")
    (na, sa), (nb, sb) = (parse_arm_option(o) for o in options)
    return resolve("A", na, sa), resolve("B", nb, sb)
