"""``bisect demo``: a throwaway repository with a silent numerics change, bisected end to end.

``build_demo_repo`` writes a small PyTorch project (an MLP classifier on generated data,
the same shape as ``examples/mlp.py``) and commits ~20 realistic edits to it: comments,
logging, a refactor, a new flag. One commit silently changes the numerics (a LayerNorm
``eps`` moved into a config constant with a different value) and one commit does not
import (a typo'd import, fixed in the next commit). ``run_demo`` then runs
``bisect runs --check match`` on it and returns the answer: the culprit commit and the
first divergence inside it.

The generator is also what the tests of ``bisect runs`` use: ``DemoRepo`` says which
commit is the culprit and which do not import, so a test can ask for a culprit next to a
broken commit, or put it on a side branch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from reprobisect.core.options import ProbeOptions
from reprobisect.errors import UsageError
from reprobisect.workflows.runs import RunsConfig, find_first_bad

__all__ = ["DemoRepo", "build_demo_repo", "run_demo", "DEMO_COMMAND", "TRAIN_PY"]

DEMO_COMMAND = ("python", "train.py", "--steps", "20", "--seed", "0")
"""The command the demo bisects (the probe stops it after ``--steps`` of the search)."""

# The generated project's files, indented here (dedented at import) so that their
# ``import torch`` lines are not read as this module's imports.
TRAIN_PY = textwrap.dedent(
    '''\
    """Train a small MLP classifier on generated data."""

    import argparse

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from model import MLP


    def make_data(n=512, dim=32, classes=4, seed=0):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, dim, generator=g)
        w = torch.randn(dim, classes, generator=g)
        y = (x @ w).argmax(1)
        return TensorDataset(x, y)


    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--steps", type=int, default=20)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--lr", type=float, default=1e-3)
        args = p.parse_args()

        torch.manual_seed(args.seed)
        data = make_data(seed=args.seed)
        loader = DataLoader(data, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(args.seed))
        model = MLP(32, 64, 4)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        loss_fn = nn.CrossEntropyLoss()

        step = 0
        while step < args.steps:
            for x, y in loader:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                step += 1
                if step >= args.steps:
                    break
        print(f"final loss {loss.item():.4f}")


    if __name__ == "__main__":
        main()
    '''
)

MODEL_PY = textwrap.dedent(
    '''\
    """The model: a small MLP with LayerNorm."""

    from torch import nn


    class MLP(nn.Module):
        def __init__(self, dim, hidden, classes):
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(dim, hidden),
                nn.LayerNorm(hidden, eps=1e-5),
                nn.GELU(),
                nn.Linear(hidden, hidden),
                nn.GELU(),
                nn.Linear(hidden, classes),
            )

        def forward(self, x):
            return self.net(x)
    '''
)

README_MD = """# tiny-mlp

A small MLP classifier on generated data.
"""

Edit = Callable[[Path], None]


def _sub(rel: str, old: str, new: str, count: int = 1) -> Edit:
    def edit(root: Path) -> None:
        p = root / rel
        text = p.read_text()
        if old not in text:
            raise RuntimeError(f"demo edit: {old!r} not in {rel}")
        p.write_text(text.replace(old, new, count))

    return edit


def _append(rel: str, text: str) -> Edit:
    def edit(root: Path) -> None:
        p = root / rel
        p.write_text((p.read_text() if p.exists() else "") + text)

    return edit


def _write(rel: str, text: str) -> Edit:
    def edit(root: Path) -> None:
        (root / rel).write_text(text)

    return edit


# (subject, edit, kind) — kind: "" neutral, "culprit" changes numerics, "broken" does not import,
# "fix" repairs the broken import. Neutral edits never change what the script computes.
_NEUTRAL: list[tuple[str, Edit]] = [
    ("docs: usage section in README", _append("README.md", "\n## Usage\n\n    python train.py --steps 200\n")),
    ("train: comment the data generator", _sub("train.py", "def make_data(", "# Labels come from a random linear map, so the task is learnable.\ndef make_data(")),
    ("train: log the loss every 10 steps", _sub("train.py", "            step += 1\n", "            step += 1\n            if step % 10 == 0:\n                print(f\"step {step} loss {loss.item():.4f}\")\n")),
    ("model: docstring for MLP", _sub("model.py", "class MLP(nn.Module):\n", "class MLP(nn.Module):\n    \"\"\"Linear -> LayerNorm -> GELU -> Linear -> GELU -> Linear.\"\"\"\n\n")),
    ("train: --batch-size flag (default unchanged)", _sub("train.py", '    p.add_argument("--lr", type=float, default=1e-3)\n', '    p.add_argument("--lr", type=float, default=1e-3)\n    p.add_argument("--batch-size", type=int, default=64)\n')),
    ("train: use --batch-size", _sub("train.py", "batch_size=64", "batch_size=args.batch_size")),
    ("gitignore: checkpoints and logs", _write(".gitignore", "*.pt\nlogs/\n__pycache__/\n")),
    ("train: rename loss_fn to criterion", _sub("train.py", "loss_fn", "criterion", count=2)),
    ("docs: describe the model", _append("README.md", "\nThe model is Linear -> LayerNorm -> GELU -> Linear -> GELU -> Linear.\n")),
    ("train: print the parameter count", _sub("train.py", "    opt = torch.optim.Adam(", "    print(f\"{sum(p.numel() for p in model.parameters())} parameters\")\n    opt = torch.optim.Adam(")),
    ("model: type hints", _sub("model.py", "def forward(self, x):", "def forward(self, x: \"torch.Tensor\") -> \"torch.Tensor\":")),
    ("train: comment the optimizer choice", _sub("train.py", "    opt = torch.optim.Adam(", "    # Adam with default betas; the lr is the only knob we tune.\n    opt = torch.optim.Adam(")),
    ("docs: changelog", _write("CHANGELOG.md", "# Changelog\n\n- batch size flag\n- loss logging\n")),
    ("train: --hidden flag (default unchanged)", _sub("train.py", '    p.add_argument("--seed", type=int, default=0)\n', '    p.add_argument("--seed", type=int, default=0)\n    p.add_argument("--hidden", type=int, default=64)\n')),
    ("train: use --hidden", _sub("train.py", "MLP(32, 64, 4)", "MLP(32, args.hidden, 4)")),
    ("train: report the final accuracy on the last batch", _sub("train.py", '    print(f"final loss', '    print(f"last-batch accuracy {(model(x).argmax(1) == y).float().mean().item():.3f}")\n    print(f"final loss')),
    ("docs: note on determinism", _append("README.md", "\nRuns are deterministic on CPU for a fixed --seed.\n")),
    ("model: comment the head", _sub("model.py", "            nn.Linear(hidden, classes),\n", "            nn.Linear(hidden, classes),  # logits\n")),
    ("train: tidy imports", _sub("train.py", "import argparse\n", "import argparse\nimport sys  # noqa: F401 (kept for --help on old pythons)\n")),
]

_CULPRITS: dict[str, tuple[str, Edit]] = {
    # silently changes numerics: the LayerNorm eps moves into a constant with another value
    "numerics": (
        "model: hoist the LayerNorm eps into a module constant",
        lambda root: (
            _sub("model.py", "from torch import nn\n", "from torch import nn\n\nNORM_EPS = 1e-6  # shared by every norm layer\n")(root),
            _sub("model.py", "nn.LayerNorm(hidden, eps=1e-5)", "nn.LayerNorm(hidden, eps=NORM_EPS)")(root),
        ),
    ),
    # crashes after training started (step 2): a checkpoint helper that does not exist
    "crash": (
        "train: checkpoint every 2 steps",
        _sub("train.py", "            step += 1\n", "            step += 1\n            if step % 2 == 0:\n                save_checkpoint(model, step)  # noqa: F821\n"),
    ),
    # non-finite from the first step: the loss is divided by (1 - smoothing) with smoothing 1.0
    "nan": (
        "train: normalise the loss by the label smoothing",
        lambda root: (
            _sub("train.py", "from model import MLP\n", "from model import MLP\n\nLABEL_SMOOTHING = 1.0\n")(root),
            _sub("train.py", "            loss.backward()\n", "            (loss / (1.0 - LABEL_SMOOTHING)).backward()\n")(root),
        ),
    ),
}
_BROKEN: tuple[str, Edit] = (
    "model: import init helpers",
    _sub("model.py", "from torch import nn\n", "from torch import nn\nfrom torch.nn import intit  # noqa: F401\n"),
)
_FIX: tuple[str, Edit] = (
    "model: fix the typo'd import",
    _sub("model.py", "from torch.nn import intit  # noqa: F401\n", ""),
)


@dataclass(frozen=True)
class DemoRepo:
    """A generated repository and what the tests need to know about it."""

    path: Path
    commits: tuple[str, ...]
    """Every commit on main, oldest first (the first is the known-good root)."""
    subjects: tuple[str, ...]
    culprit: str
    """The commit that silently changes the numerics."""
    broken: tuple[str, ...]
    """Commits whose code does not import (probes skip them)."""
    good: str
    bad: str
    command: tuple[str, ...] = DEMO_COMMAND
    branch_commits: tuple[str, ...] = field(default=())
    """Commits made on a side branch (when ``culprit_on_branch``)."""


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    e = dict(os.environ)
    e.update(env or {})
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=e)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed in {root}: {r.stderr.strip()}")
    return r.stdout.strip()


_AUTHORS = [("Ada Park", "ada@example.com"), ("Ben Ortiz", "ben@example.com"), ("Chen Wu", "chen@example.com")]


class _History:
    """Commits to the demo repository: a fixed clock (7 hours a commit) and rotating authors,
    so the same plan always gives the same hashes."""

    def __init__(self, root: Path, proj: Path) -> None:
        self.root, self.proj = root, proj
        self.clock = 1_700_000_000
        self.subjects: list[str] = []

    def commit(self, subject: str) -> str:
        self.clock += 3600 * 7
        name, email = _AUTHORS[len(self.subjects) % len(_AUTHORS)]
        date = f"@{self.clock} +0000"
        env = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
            "GIT_COMMITTER_DATE": date,
        }
        _git(self.root, "add", "-A", env=env)
        _git(self.root, "commit", "-q", "-m", subject, env=env)
        h = _git(self.root, "rev-parse", "HEAD")
        self.subjects.append(subject)
        return h

    def edit_and_commit(self, subject: str, edit: Edit) -> str:
        edit(self.proj)
        return self.commit(subject)

    def merge(self, branch: str) -> str:
        """Merge ``branch`` into the checked-out branch with ``--no-ff``, an hour later."""
        self.clock += 3600
        subject = f"Merge branch '{branch}'"
        date = f"@{self.clock} +0000"
        _git(self.root, "merge", "-q", "--no-ff", "-m", subject, branch,
             env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date})
        self.subjects.append(subject)
        return _git(self.root, "rev-parse", "HEAD")


def _init_demo_repo(root: Path, subdir: str) -> Path:
    """A new git repository at ``root`` with the project's files in ``subdir`` (not committed yet)."""
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise UsageError(f"{root} is not empty; give --dir a new or empty folder")
    proj = root / subdir
    proj.mkdir(parents=True, exist_ok=True)
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.name", "Demo")
    _git(root, "config", "user.email", "demo@example.com")
    _git(root, "config", "commit.gpgsign", "false")
    (proj / "train.py").write_text(TRAIN_PY)
    (proj / "model.py").write_text(MODEL_PY)
    (proj / "README.md").write_text(README_MD)
    return proj


def _plan(
    n_commits: int, culprit_at: int, broken_at: int | None, broken_fixed: bool,
    culprit_edit: tuple[str, Edit], neutral: Iterator[tuple[str, Edit]],
) -> list[tuple[str, Edit, str]]:
    """(subject, edit, kind) of commits 1..n_commits; kind is '', 'culprit', 'culprit+fix', 'broken' or 'fix'."""
    plan: list[tuple[str, Edit, str]] = []
    for i in range(1, n_commits + 1):
        if i == culprit_at and broken_at is not None and i == broken_at + 1:
            subject, e1 = culprit_edit
            plan.append((subject, (lambda r, e1=e1: (e1(r), _FIX[1](r))), "culprit+fix"))
        elif i == culprit_at:
            plan.append((*culprit_edit, "culprit"))
        elif broken_at is not None and i == broken_at:
            plan.append((*_BROKEN, "broken"))
        elif broken_at is not None and broken_fixed and i == broken_at + 1:
            plan.append((*_FIX, "fix"))
        else:
            s, e = next(neutral)
            plan.append((s, e, ""))
    return plan


def _culprit_on_branch(
    history: _History, subject: str, edit: Edit, neutral: Iterator[tuple[str, Edit]]
) -> tuple[str, list[str], list[str]]:
    """The culprit and a neutral commit on branch ``feature``, a neutral commit on main, the
    merge; returns (culprit, the branch's commits, main's new commits)."""
    _git(history.root, "checkout", "-q", "-b", "feature")
    culprit = history.edit_and_commit(subject, edit)
    branch = [culprit, history.edit_and_commit(*next(neutral))]
    _git(history.root, "checkout", "-q", "main")
    main = [history.edit_and_commit(*next(neutral))]
    main.append(history.merge("feature"))
    return culprit, branch, main


def build_demo_repo(
    path: str | os.PathLike,
    *,
    n_commits: int = 20,
    culprit_at: int = 13,
    broken_at: int | None = 6,
    broken_fixed: bool = True,
    culprit_on_branch: bool = False,
    culprit_kind: str = "numerics",
    subdir: str = ".",
) -> DemoRepo:
    """Create the demo repository at ``path`` (a new or empty folder); returns its layout.

    ``n_commits`` counts commits after the root; commit ``culprit_at`` (1-based) changes
    the numerics; commit ``broken_at`` (None: none) does not import and, with
    ``broken_fixed`` (default), the next commit fixes it; without, every later commit
    stays broken. With ``culprit_on_branch`` the
    culprit and two neutral commits are made on a side branch that is merged back with
    ``--no-ff``. ``culprit_kind``: 'numerics' (silent change), 'crash' (raises at step 2)
    or 'nan' (NaN loss from step 1). When the culprit directly follows the broken commit,
    the culprit also repairs the import (so the two are indistinguishable: "could be any of").
    ``subdir`` puts the project in a subfolder of the repository.
    """
    culprit_edit = _CULPRITS[culprit_kind]
    root = Path(path)
    history = _History(root, _init_demo_repo(root, subdir))
    commits = [history.commit("initial: MLP classifier on generated data")]
    neutral = iter(_NEUTRAL * 4)
    plan = _plan(n_commits, culprit_at, broken_at, broken_fixed, culprit_edit, neutral)
    culprit = ""
    broken: list[str] = []
    branch_commits: list[str] = []
    open_broken = False
    for subject, edit, kind in plan:
        if culprit_on_branch and kind.startswith("culprit"):
            culprit, branch, main = _culprit_on_branch(history, subject, edit, neutral)
            branch_commits += branch
            commits += main
            continue
        h = history.edit_and_commit(subject, edit)
        commits.append(h)
        if kind.startswith("culprit"):
            culprit = h
        if kind == "broken":
            open_broken = True
        if kind.endswith("fix"):
            open_broken = False
        if open_broken:
            broken.append(h)
    return DemoRepo(
        path=root,
        commits=tuple(commits),
        subjects=tuple(history.subjects),
        culprit=culprit,
        broken=tuple(broken),
        good=commits[0],
        bad=commits[-1],
        branch_commits=tuple(branch_commits),
    )


def run_demo(
    directory: str | os.PathLike | None = None,
    *,
    jobs: int = 2,
    quiet: bool = False,
    keep: bool = False,
    progress: Any = None,
    on_built: Callable[[DemoRepo], None] | None = None,
) -> tuple[DemoRepo, Any]:
    """Build the demo repository (in ``directory`` or a tmp dir) and bisect it.

    Returns ``(DemoRepo, RunsResult)``. A tmp dir is removed afterwards unless ``keep``;
    a given ``directory`` is always kept. ``on_built`` is called once the repository exists.
    """
    tmp = None
    if directory is None:
        tmp = tempfile.mkdtemp(prefix="reprobisect-demo-")
        directory = Path(tmp) / "tiny-mlp"
    try:
        repo = build_demo_repo(directory)
        if on_built is not None:
            on_built(repo)
        config = RunsConfig(
            repo=str(repo.path),
            cwd=str(repo.path),
            good=repo.good,
            bad=repo.bad,
            command=repo.command,
            check="match",
            options=ProbeOptions(jobs=jobs, steps=3, quiet=quiet),
        )
        result = find_first_bad(config, progress=progress)
        return repo, result
    finally:
        if tmp is not None and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
