"""The cluster files cannot rot: every ``bisect`` command shown in docs/cluster.md (and in the
configs' comments) parses with the real command line, the configs load as the tools expect,
and the Dockerfile has what a CUDA node needs. Static checks only (no Docker engine here)."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from reprobisect.cli import cli
from reprobisect.executors.ray import RayConfig

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cluster.md"
CONFIGS = (ROOT / "configs" / "ray-cluster.yaml", ROOT / "configs" / "kuberay.yaml")


def _joined(lines: list[str]) -> list[str]:
    """Lines with backslash continuations joined."""
    out: list[str] = []
    buf = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def _fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of each fenced code block of a Markdown text."""
    blocks: list[tuple[str, list[str]]] = []
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            if current is None:
                lang, current = line[3:].strip(), []
            else:
                blocks.append((lang, current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _doc_commands() -> list[str]:
    """Every ``bisect ...`` line inside the shell (unlabelled) fenced blocks of docs/cluster.md."""
    return [line.strip() for lang, lines in _fenced_blocks(DOC.read_text()) if lang in ("", "sh", "bash", "console")
            for line in _joined(lines) if line.strip().startswith("bisect ")]


def _config_commands() -> list[str]:
    """``bisect ...`` lines in the configs' header comments (``#   bisect runs ... \\``)."""
    found = []
    for path in CONFIGS:
        comments = [line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")]
        found += [line for line in _joined(comments) if line.startswith("bisect ")]
    return found


def _pinned(package: str) -> str:
    """The version constraints/dev.txt pins (what the test environment and CI run)."""
    pins = dict(line.split("==", 1) for line in (ROOT / "constraints" / "dev.txt").read_text().split() if "==" in line)
    return pins[package]


def _parse(line: str) -> dict:
    """Parse one command line with the real click command (no command runs)."""
    argv = shlex.split(line)
    assert argv[0] == "bisect", line
    name, rest = argv[1], argv[2:]
    command = cli.get_command(None, name)  # type: ignore[arg-type]
    assert command is not None, f"no command '{name}': {line}"
    ctx = command.make_context(name, rest)
    params = dict(ctx.params)
    # the training command is exactly what follows --: a misspelt flag before it would have
    # been taken into it (the probing commands pass unknown options through to the command)
    if "--" in rest:
        after = tuple(rest[rest.index("--") + 1:])
        if tuple(params.get("cmd") or ()) != after:
            raise click.UsageError(f"not every option before -- is a '{name}' option: {line}")
    if params.get("executor") == "ray":  # the executor's own settings are valid too
        RayConfig(address=params.get("ray__address"), gpus_per_probe=params.get("ray__gpus_per_probe") or 0.0,
                  cpus_per_probe=params.get("ray__cpus_per_probe") or 1.0, placement=params.get("ray__placement"))
    return params


def test_every_bisect_command_in_the_cluster_docs_parses_with_the_real_cli():
    commands = _doc_commands()
    assert len(commands) >= 5, commands  # the page shows a real search and the other searches
    parsed = [_parse(c) for c in commands]
    for line, params in zip(commands, parsed):
        assert params["executor"] == "ray", line
        assert params["cmd"], line  # the training command after --
    search = next(p for c, p in zip(commands, parsed) if c.startswith("bisect runs") and "torchrun" in c)
    assert search["ray__address"] == "auto" and search["ray__gpus_per_probe"] == 8.0
    assert list(search["cmd"][:3]) == ["torchrun", "--nproc_per_node", "8"]
    assert {p.get("ray__placement") for p in parsed} >= {"pack", "spread"}


def test_every_bisect_command_in_the_configs_parses_and_a_wrong_one_would_not():
    commands = _config_commands()
    assert len(commands) == len(CONFIGS), commands
    for c in commands:
        _parse(c)
    with pytest.raises(click.UsageError, match="No such option '--gpus-per-node'"):  # a misspelt flag before --
        _parse("bisect runs --good a --bad b --executor ray --gpus-per-node 8 -- python train.py")
    with pytest.raises(click.UsageError, match="No such option '--gpus-per-node'"):
        _parse("bisect repro --executor ray --gpus-per-node 8 -- python train.py")
    with pytest.raises(Exception, match="whole number"):
        _parse("bisect runs --executor ray --gpus-per-probe 2.5 --good a --bad b -- python train.py")


def test_the_docs_config_file_gives_the_same_options_as_the_flags(tmp_path):
    from reprobisect.cli.options import build_options

    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    assert block, "docs/cluster.md shows a --config file"
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(block.group(1))
    opts = build_options({}, config=cfg)  # unknown keys or bad values would raise here
    assert opts.executor == "ray" and opts.jobs == 2 and opts.timeout == 3600
    assert opts.executor_config == RayConfig(address="auto", gpus_per_probe=8)


def test_the_ray_cluster_configs_load():
    up = yaml.safe_load(CONFIGS[0].read_text())
    assert up["head_node_type"] in up["available_node_types"]
    assert up["available_node_types"][up["head_node_type"]]["resources"] == {"CPU": 0}  # no probe on the head
    assert any(t.get("min_workers", 0) >= 1 for n, t in up["available_node_types"].items() if n != up["head_node_type"])
    assert "reprobisect" in up["docker"]["image"]
    kube = yaml.safe_load(CONFIGS[1].read_text())
    assert (kube["apiVersion"], kube["kind"]) == ("ray.io/v1", "RayCluster")
    assert kube["spec"]["rayVersion"] == _pinned("ray")  # the cluster's Ray and the controller's agree
    workers = kube["spec"]["workerGroupSpecs"]
    gpu = workers[0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpu) == 8 and workers[0]["minReplicas"] >= 1
    for pod in [kube["spec"]["headGroupSpec"]["template"]["spec"]] + [w["template"]["spec"] for w in workers]:
        assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"] for m in workers[0]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert "/dev/shm" in mounts


# --------------------------------------------------------------------------- Dockerfile


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: comments dropped, continuations joined."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    out = []
    for line in _joined(lines):
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_the_dockerfile_builds_a_cuda_node_image_as_a_non_root_user():
    ins = _instructions((ROOT / "Dockerfile").read_text())
    words = [w for w, _ in ins]
    assert words[0] in ("ARG", "FROM") and "FROM" in words
    args = dict(a.partition("=")[::2] for w, a in ins if w == "ARG")
    assert {"TORCH_INDEX_URL", "TORCH_VERSION", "RAY_VERSION"} <= set(args)
    assert re.fullmatch(r"https://download\.pytorch\.org/whl/cu12\d", args["TORCH_INDEX_URL"])  # CUDA 12.x by default
    assert args["RAY_VERSION"] == _pinned("ray")
    assert args["TORCH_VERSION"] in ("", _pinned("torch").split("+")[0])
    runs = " && ".join(a for w, a in ins if w == "RUN")
    apt = re.search(r"apt-get install ([^&]*)", runs).group(1).split()
    assert "git" in apt and {"g++", "gcc", "clang"} & set(apt)  # git; a compiler for reprobisect/native
    assert '--index-url "${TORCH_INDEX_URL}"' in runs and "torch${TORCH_VERSION:+==${TORCH_VERSION}}" in runs
    assert '"ray[default]==${RAY_VERSION}"' in runs
    assert re.search(r'pip install "/opt/reprobisect\[torch\]"', runs)  # the package itself, torch kept
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1] not in ("root", "0")
    last_user = max(i for i, (w, _) in enumerate(ins) if w == "USER")
    pip_at = [i for i, (w, a) in enumerate(ins) if w == "RUN" and "pip install" in a]
    assert pip_at and min(pip_at) > last_user  # packages go into the user's venv, not as root
    assert ins[-2:] == [("ENTRYPOINT", '["/usr/bin/tini", "--"]'), ("CMD", '["bisect", "--help"]')]
    # what the image copies is not excluded by .dockerignore
    ignored = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]
    for w, a in ins:
        if w == "COPY":
            for src in [s for s in a.split() if not s.startswith("--")][:-1]:
                assert (ROOT / src).exists(), src
                assert not any(fnmatch.fnmatch(src, pat) for pat in ignored), src


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed")
def test_hadolint_finds_nothing():
    r = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
