"""The exit statuses (README's table, ``--help``, the code's constants agree) and shell completion."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamoffload.cli import build_parser, main
from streamoffload.cli_common import EXIT_STATUSES, EXIT_TIMEOUT, EXIT_USAGE
from tests.commands.test_operator_experience import _all_parsers

REPO = Path(__file__).resolve().parents[2]


def readme_exit_table() -> list[tuple[int, str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("Exit statuses, the same for every command", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", section, flags=re.M)
    return [(int(code), meaning.replace("\\|", "|")) for code, meaning in rows]


def test_the_readme_table_of_exit_statuses_is_the_codes() -> None:
    assert readme_exit_table() == list(EXIT_STATUSES)
    assert [code for code, _ in EXIT_STATUSES] == [0, 1, 2, 3, 130, 141]


def test_help_lists_every_exit_status() -> None:
    text = build_parser().format_help()
    listed = re.findall(r"^  (\d+) +(.+)$", text.split("exit statuses (every command):", 1)[1], flags=re.M)
    assert [(int(c), t) for c, t in listed] == [(code, meaning.replace("`", "")) for code, meaning in EXIT_STATUSES]


def test_bad_usage_is_exit_2_and_no_command_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["cleanup", "--no-such-option"])
    assert exit_info.value.code == EXIT_USAGE
    assert main([]) == EXIT_USAGE
    capsys.readouterr()


def test_offload_status_timeout_has_its_own_status() -> None:
    assert EXIT_TIMEOUT not in (0, 1, EXIT_USAGE)
    help_text = _all_parsers()["offload-status"].format_help()  # type: ignore[attr-defined]
    assert "3 on --timeout" in " ".join(help_text.split())


def commands() -> list[str]:
    """Every command and subcommand word (``table``, ``sync``, ...)."""
    return sorted({word for name in _all_parsers() for word in name.split()})


def completion(shell: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "streamoffload", "completion", shell], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_naming_every_command(shell: str) -> None:
    script = completion(shell)
    if shell == "zsh":
        assert script.startswith("#compdef streamoffload\n")
    missing = [name for name in commands() if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", script)]
    assert missing == []
    assert "--dry-run" in script and "--grace-minutes" in script  # options of a subcommand too


def test_bash_completes_commands_and_options(tmp_path: Path) -> None:
    """The bash script, sourced, completes as bash would call it: COMP_WORDS and COMP_CWORD in, COMPREPLY out."""
    script = tmp_path / "streamoffload.bash"
    script.write_text(completion("bash"))

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        program = (
            f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
            f'COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; _shtab_streamoffload; printf "%s\\n" "${{COMPREPLY[@]}}"'
        )
        done = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    top = sorted(name for name in _all_parsers() if name and " " not in name)
    assert complete("streamoffload", "") == top
    assert complete("streamoffload", "cle") == ["cleanup"]
    assert complete("streamoffload", "cleanup", "--dr") == ["--dry-run"]
    assert complete("streamoffload", "completion", "") == ["bash", "zsh"]
