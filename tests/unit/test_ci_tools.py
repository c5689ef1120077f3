"""A tool the suite needs and cannot find skips the test on a developer's machine and fails it under CI
(``tests.fixtures.tools``), so a CI image without moto, promtool or node cannot pass by skipping."""

from __future__ import annotations

import pytest

from tests.fixtures.tools import debian_prometheus_tool, missing_tool


def test_a_missing_tool_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"no-such-tool is not installed.*CI is set"):
        debian_prometheus_tool("no-such-tool")
    with pytest.raises(pytest.fail.Exception, match="moto_server not found"):
        missing_tool("moto_server not found")


def test_a_missing_tool_skips_without_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no-such-tool is not installed"):
        debian_prometheus_tool("no-such-tool")
