"""The generated references: config keys from the models, metrics from the daemon's registry."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from tfrecordd.config import DaemonSection, MetricsSection
from tfrecordd.configref import metric_descriptions, render, render_metrics
from tfrecordd.datasets import OutputSection
from tfrecordd.metrics import Metrics
from tfrecordd.plugin import Registry, SourceConfig
from tfrecordd.units import Duration, Size

ROOT = Path(__file__).resolve().parents[2]
CONFIG_DOC = ROOT / "docs" / "config-reference.md"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"
METRICS_START = "<!-- metrics-reference:start -->"
METRICS_END = "<!-- metrics-reference:end -->"


class ToySourceConfig(SourceConfig):
    """``type = "toy"``: a source used only to test the reference."""

    model_config = ConfigDict(use_attribute_docstrings=False)

    type: Literal["toy"] = "toy"
    every: Duration = Field(default=2.5, gt=0)
    """How often the toy ticks."""
    budget: Size = 3 << 20
    """The toy's memory |budget|."""
    mode: Literal["fast", "slow"] = "fast"
    """Which way to run."""


def _rows(markdown: str, heading: str) -> dict[str, list[str]]:
    """The table rows under ``heading`` (up to the next heading), keyed by the key's name."""
    start = markdown.index(heading + "\n")
    rest = markdown[start + len(heading) + 1 :]
    section = re.split(r"^#{2,3} ", rest, maxsplit=1, flags=re.M)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_docs_config_reference_is_current() -> None:
    expected = render()
    assert CONFIG_DOC.read_text() == expected, (
        f"{CONFIG_DOC.relative_to(ROOT)} is out of date with the config models or the installed "
        "plugins; regenerate it with:\n"
        "  python -m tfrecordd.configref > docs/config-reference.md"
    )


def test_every_key_of_the_shared_sections_is_listed_with_a_description() -> None:
    text = render(Registry({}, {}))
    for heading, model in (
        ("## `[daemon]`", DaemonSection),
        ("## `[metrics]`", MetricsSection),
        ("## `[output]`", OutputSection),
    ):
        rows = _rows(text, heading)
        assert set(rows) == set(model.model_fields), heading
        for key, (_, _, description) in rows.items():
            assert description, f"{heading} {key} has no description"


def test_shown_defaults_are_valid_config_values_equal_to_the_real_defaults() -> None:
    text = render(Registry({}, {}))
    for heading, model in (("## `[daemon]`", DaemonSection), ("## `[output]`", OutputSection)):
        for key, (_, default, _) in _rows(text, heading).items():
            field = model.model_fields[key]
            if not default.startswith("`") or default == "`(unset)`":
                continue
            value = tomllib.loads(f"v = {default.strip('`')}")["v"]
            required = {"dir": "/x"} if model is OutputSection else {}
            parsed = model.model_validate(required | {key: value})
            real = field.get_default(call_default_factory=True)
            assert getattr(parsed, key) == real, f"{heading} {key}: {default}"


def test_plugin_keys_with_types_defaults_limits_and_docstrings_from_the_source() -> None:
    text = render(Registry({"toy": ToySourceConfig}, {}))
    assert ToySourceConfig.model_fields["every"].description is None, "the fallback is tested"
    rows = _rows(text, '### `type = "toy"` (`[[sources]]`, at-least-once)')
    assert set(rows) == {"every", "budget", "mode"}, "shared keys are listed once, not per plugin"
    assert rows["every"] == ["`Duration`", '`"2.5s"`', "How often the toy ticks. Must be > 0."]
    assert rows["budget"] == ["`Size`", '`"3MiB"`', "The toy's memory \\|budget\\|."]
    assert rows["mode"] == ['`"fast" \\| "slow"`', '`"fast"`', "Which way to run."]
    shared = _rows(text, "## Sources")
    assert set(shared) == {"name", "type", "dataset", "route", "encoder"}


def test_operations_doc_lists_every_metric() -> None:
    text = OPERATIONS_DOC.read_text()
    block = text[text.index(METRICS_START) + len(METRICS_START) : text.index(METRICS_END)]
    assert block.strip() == render_metrics().strip(), (
        "the metrics table in docs/operations.md is out of date with tfrecordd.metrics; "
        "replace the lines between the metrics-reference markers with the output of:\n"
        "  python -m tfrecordd.configref --metrics"
    )
    for name, _, labels, _ in metric_descriptions(Metrics()):
        row = next(line for line in block.splitlines() if line.startswith(f"| `{name}"))
        for label in labels:
            assert f"`{label}`" in row, f"{name}: label {label} not documented"
