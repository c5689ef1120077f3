"""Where a bench that starts Spark sends the logs: a file, the way ``streamoffload --log-file`` does
(``cli_common.configure_logging``), so the terminal shows the bench's figures and errors only, not Spark's
own records (e.g. ``ERROR TorrentBroadcast: Store broadcast ... fail`` when a query stops)."""

from __future__ import annotations

from pathlib import Path

from streamoffload.cli_common import LogSettings, configure_logging


def log_beside(work: str | Path) -> Path:
    """Send Spark's output and Python's log lines to ``<work>.log`` and print where it is. Call it before
    ``build_session``. The file sits beside the work directory, not in it, so it outlives the work
    directory's removal at the end of a run (or after a failure)."""
    path = Path(f"{Path(work).resolve()}.log")
    configure_logging(LogSettings(log_file=str(path)))
    print(f"logs (Spark, job): {path}")
    return path
