"""The dashboard and the alert rules as the text files ``dashboard export`` writes: stable output, so
diffs of the committed copies (docker/) are real."""

from __future__ import annotations

import json
from typing import Any

from streamoffload.dashboard.alerts import alert_rules
from streamoffload.dashboard.model import build_dashboard


def dashboard_json(dashboard: dict[str, Any] | None = None) -> str:
    """The dashboard as the text ``dashboard export`` writes (stable: diffs of the committed copy are real)."""
    return json.dumps(dashboard if dashboard is not None else build_dashboard(), indent=2) + "\n"


def alert_rules_yaml(rules: dict[str, Any] | None = None) -> str:
    """The rule file ``dashboard export --alerts`` writes: YAML, block style, every string double-quoted (a
    JSON string is a valid YAML double-quoted scalar), so no YAML library is needed."""
    doc = rules if rules is not None else alert_rules()
    header = "# Prometheus alerting rules for streamoffload (generated: streamoffload dashboard export --alerts)\n"
    return header + yaml_text(doc)


def yaml_text(doc: dict[str, object]) -> str:
    """``doc`` as YAML in the rule file's style (block style, every string double-quoted)."""
    return "\n".join(_yaml_lines(doc, 0)) + "\n"


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _yaml_lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    lines: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{key}:")
                lines.extend(_yaml_lines(item, indent + 2))
            else:
                lines.append(f"{pad}{key}: {_yaml_scalar(item) if not isinstance(item, dict | list) else '[]'}")
    elif isinstance(value, list):
        for item in value:
            sub = _yaml_lines(item, indent + 2)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_yaml_scalar(item)}")
    else:
        lines.append(pad + _yaml_scalar(value))
    return lines
