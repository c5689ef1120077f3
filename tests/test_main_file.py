"""``spark-submit .../streamoffload/__main__.py`` runs the file as a script, so Python puts the package's own
directory first on sys.path; ``__main__`` takes it off before anything else is imported, or its ``pulsar/`` would
be pulsar-client's ``pulsar`` (the job failed at its first micro-batch on a cluster: no ``pulsar.Client``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import streamoffload.__main__ as main_module


def test_running_the_main_file_leaves_top_level_modules_unshadowed() -> None:
    main_file = Path(main_module.__file__).resolve()
    probe = (
        "import runpy, sys\n"
        f"sys.path.insert(0, {str(main_file.parent)!r})  # what running the file as a script does\n"
        f"runpy.run_path({str(main_file)!r}, run_name='not_main')\n"
        "import pulsar\n"
        "print(pulsar.__file__, hasattr(pulsar, 'Client'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    path, has_client = out.split()
    assert has_client == "True" and Path(path).parent != main_file.parent / "pulsar", out
