"""The root of the dashboard's errors (building it, pushing it to Grafana): this service's one base."""

from __future__ import annotations

from streamoffload.errors import StreamOffloadError


class DashboardError(StreamOffloadError):
    """The dashboard or its alert rules cannot be built or delivered."""
