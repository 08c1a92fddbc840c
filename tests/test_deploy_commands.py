"""Every `headroom` command line that the deployment runs or the docs show is a real command.

Sources: the compose services built from the headroom image, the Kubernetes containers running it,
and the code in docs/operations.md and README.md. For each line: its subcommand is listed by
`headroom --help`, `headroom <sub> --help` exits 0 (and is not the "not built yet" placeholder),
and every `--flag` on the line is an option of that subcommand.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner
from support.waiting import patient

from collector.cli import main

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/operations.md", "README.md")
HEADROOM_IMAGE = "llm-headroom"
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"(?<![\w./=-])headroom((?:\s+[^\s|;&#`)]+)*)")  # not --user=headroom


def _compose_lines() -> list[tuple[str, list[str]]]:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    return [
        (f"docker-compose.yml:{name}", [str(word) for word in service["command"]])
        for name, service in services.items()
        if HEADROOM_IMAGE in service.get("image", "")
    ]


def _kubernetes_lines() -> list[tuple[str, list[str]]]:
    lines = []
    for path in sorted((ROOT / "deploy/kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            outer = (doc or {}).get("spec", {})
            outer = outer.get("jobTemplate", {}).get("spec", outer)  # a CronJob's pod is one level down
            spec = outer.get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if container["image"].startswith(HEADROOM_IMAGE):
                    lines.append((f"{path.name}:{container['name']}", [str(a) for a in container["args"]]))
    return lines


def _code_in(markdown: str) -> list[str]:
    """Shell lines inside fenced blocks (continuations joined) and inline code spans."""
    blocks = [block.replace("\\\n", " ") for block in _FENCE.findall(markdown)]
    prose = _FENCE.sub("", markdown)
    return [line for block in blocks for line in block.splitlines()] + _INLINE.findall(prose)


def _doc_lines() -> list[tuple[str, list[str]]]:
    lines = []
    for name in DOCS:
        path = ROOT / name
        if not path.exists():
            continue
        for code in _code_in(path.read_text()):
            for match in _COMMAND.finditer(code):
                words = shlex.split(match.group(1), comments=True) if match.group(1).strip() else []
                if words and not words[0].startswith("-"):
                    lines.append((f"{name}: headroom {match.group(1).strip()}", words))
    return lines


def _resolve(words: list[str]) -> tuple[list[str], click.Command]:
    """Walk subcommands (`capacity kv`, `dashboards generate`) until the first non-command word."""
    command: click.Command = main
    path: list[str] = []
    ctx = click.Context(main)
    for word in words:
        if not isinstance(command, click.Group) or word.startswith("-"):
            break
        sub = command.get_command(ctx, word)
        assert sub is not None, f"`headroom {' '.join(path + [word])}` is not a command"
        command, path = sub, path + [word]
    return path, command


def _unknown_flags(words: list[str]) -> list[str]:
    """The `--flags` on a command line that its (sub)command does not define."""
    path, command = _resolve(words)
    params = command.get_params(click.Context(command, info_name=path[-1]))  # includes -h/--help
    options = {opt for param in params for opt in (*param.opts, *param.secondary_opts)}
    return [flag for word in words if word.startswith("--") if (flag := word.split("=", 1)[0]) not in options]


@pytest.fixture(scope="module")
def listed_subcommands() -> set[str]:
    """Subcommand names as `headroom --help` (the installed program) lists them."""
    program = shutil.which("headroom", path=str(Path(sys.executable).parent)) or shutil.which("headroom")
    assert program, "the `headroom` program is not installed: pip install -e ."
    result = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=patient(60))
    assert result.returncode == 0, result.stderr
    section = result.stdout.split("Commands:", 1)[1]
    return {line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()}


def test_docs_and_deployments_contain_headroom_commands():
    assert len(_compose_lines()) == 2  # sim, sidecar
    assert len(_kubernetes_lines()) == 3  # sidecar, the lake's committer and maintenance
    assert (ROOT / "docs/operations.md").exists()
    assert len([1 for where, _ in _doc_lines() if where.startswith("docs/operations.md")]) >= 5


@pytest.mark.parametrize(
    ("where", "words"),
    _compose_lines() + _kubernetes_lines() + _doc_lines(),
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_command_line_is_a_real_headroom_command(where, words, listed_subcommands):
    assert words and words[0] in listed_subcommands, (
        f"{where}: `{words[0] if words else ''}` is not listed by `headroom --help`"
    )
    path, command = _resolve(words)
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0, f"{where}: `headroom {' '.join(path)} --help` failed:\n{result.output}"
    assert "not built yet" not in " ".join(result.output.split()), (
        f"{where}: `headroom {path[0]}` is not built yet"
    )
    unknown = _unknown_flags(words)
    assert not unknown, f"{where}: `headroom {' '.join(path)}` has no option {unknown}"


def test_unknown_flags_are_caught():
    assert _unknown_flags(["run", "--upstream", "http://e:8000", "--no-such-flag"]) == ["--no-such-flag"]
    assert _unknown_flags(["run", "--listen=0.0.0.0:9100", "--help"]) == []


def test_the_extractor_finds_continued_and_inline_commands():
    markdown = (
        "Run `headroom report --since 7d` weekly; not llm-headroom nor headroom_metric.\n"
        "```bash\nHEADROOM_TOKEN=x headroom run \\\n  --upstream http://e:8000\n"
        "pip install llm-headroom\n```\n"
    )
    found = [
        shlex.split(_COMMAND.search(code).group(1)) for code in _code_in(markdown) if _COMMAND.search(code)
    ]
    assert found == [["run", "--upstream", "http://e:8000"], ["report", "--since", "7d"]]
