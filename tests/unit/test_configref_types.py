"""The config reference speaks the config's language: no Python class, alias or validator name
where a type is shown, and a file mode in octal, as it is written."""

from __future__ import annotations

import re

from tfrecordd.configref import USER_TYPES, render


def _type_cells(text: str) -> list[str]:
    cells = []
    for line in text.splitlines():
        parts = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(parts) == 4 and parts[0].startswith("`") and parts[1].startswith("`"):
            cells.append(parts[1].strip("`"))
    return cells


def test_every_type_is_a_config_type_a_choice_a_table_or_an_array() -> None:
    text = render()
    words = {"table", "of", "name", "array", "any", "feature", "partition", "completion", "route"}
    for cell in _type_cells(text):
        names = set(re.findall(r"[A-Za-z_]\w*", re.sub(r'"[^"]*"', "", cell)))
        assert names <= USER_TYPES | words, cell
    for internal in ("Annotated", "Section", "FeatureSpec", "Compression`", "BeforeValidator"):
        assert internal not in text


def test_a_socket_mode_is_shown_in_octal() -> None:
    row = next(line for line in render().splitlines() if line.startswith("| `mode` |"))
    assert "`0o660`" in row
    assert "432" not in row
    assert "≤ 0o777" in row
