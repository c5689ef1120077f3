"""Write docs/source-options.md, the Pulsar source's options reference, from the option definitions
(``streaming/source/source_options.py``'s ``OPTIONS``), so the doc says what the code reads.

``--check`` writes nothing and exits 1 when the file is not what this script writes
(``tests/streaming/source/test_options_reference.py`` checks the same).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from streamoffload.streaming.source.source_options import OPTIONS, OptionDoc

DOC = Path(__file__).resolve().parents[1] / "docs" / "source-options.md"

HEADER = """\
# The Pulsar source's options

<!-- Written by scripts/gen_source_options.py from streaming/source/source_options.py (OPTIONS): edit those,
then run `.venv/bin/python scripts/gen_source_options.py`. -->

`spark.readStream.format("pulsar")` (and `spark.read` for batch reads) takes these options. Names are
case-insensitive, as Spark makes them; pulsar-spark's names are accepted too, so its users' options carry over.
Each bad value fails on the driver with one line naming the option.
"""


def markdown(text: str) -> str:
    """The definitions are reStructuredText-flavoured (docstring style): ``code`` becomes `code`."""
    return text.replace("``", "`")


def names(option: OptionDoc) -> str:
    return ", ".join(f"`{name}`" for name in option.names)


def anchor(option: OptionDoc) -> str:
    """GitHub's anchor of the option's details heading: its text lower-cased, punctuation dropped, spaces as -."""
    heading = " ".join(option.names)
    return "".join(c for c in heading.lower() if c.isalnum() or c in " -_").replace(" ", "-")


def render() -> str:
    lines = [HEADER, "| Option | Default | What it does |", "| --- | --- | --- |"]
    for option in OPTIONS:
        summary = markdown(option.summary).replace("|", "\\|")
        if option.details:
            summary += f" [More](#{anchor(option)})"
        lines.append(f"| {names(option)} | {option.default} | {summary} |")
    lines += ["", "## Details", ""]
    for option in OPTIONS:
        if option.details:
            lines += [f"### {names(option)}", "", markdown(option.summary), ""]
            lines += [markdown(part) + "\n" for part in option.details.split("\n\n")]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is stale; write nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC}: stale; run scripts/gen_source_options.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
