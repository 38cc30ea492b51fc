"""configure_logging: JSON lines with zap's keys, console lines, thresholds, library records."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import structlog

from pko.logging import configure_logging


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


def records(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_use_zap_keys_and_carry_bound_and_context_values() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    structlog.contextvars.bind_contextvars(controller="stack-controller")
    structlog.get_logger().bind(key="ns/s").info("Reconciling", generation=3)
    (rec,) = records(out)
    assert rec["msg"] == "Reconciling" and rec["level"] == "info"
    assert rec["controller"] == "stack-controller" and rec["key"] == "ns/s" and rec["generation"] == 3
    assert isinstance(rec["ts"], str) and rec["ts"].endswith("Z")


def test_level_threshold_applies_to_ours_and_to_libraries() -> None:
    out = io.StringIO()
    configure_logging("WARNING", "json", stream=out)
    structlog.get_logger().info("hidden")
    structlog.get_logger().warning("shown")
    logging.getLogger("aiohttp.client").info("hidden too")
    logging.getLogger("aiohttp.client").error("library error")
    assert [(r["msg"], r["level"]) for r in records(out)] == [
        ("shown", "warning"),
        ("library error", "error"),
    ]
    assert records(out)[1]["logger"] == "aiohttp.client"


def test_exceptions_are_rendered_into_the_json_line() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    try:
        raise RuntimeError("kaput")
    except RuntimeError as exc:
        structlog.get_logger().error("Reconciler error", exc_info=exc)
    (rec,) = records(out)
    assert "RuntimeError: kaput" in str(rec["exception"])


def test_console_format_is_one_readable_line() -> None:
    out = io.StringIO()
    configure_logging("debug", "console", stream=out)
    structlog.get_logger().debug("Starting workers", worker_count=25)
    line = out.getvalue()
    assert "Starting workers" in line and "worker_count=25" in line and "debug" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def test_reconfiguring_replaces_our_handler_instead_of_adding_one() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", stream=first)
    configure_logging("info", "json", stream=second)
    logging.getLogger("lib").warning("once")
    assert first.getvalue() == ""
    assert len(records(second)) == 1


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "json"), ("info", "xml")])
def test_unknown_level_or_format_is_refused(level: str, fmt: str) -> None:
    with pytest.raises(ValueError):
        configure_logging(level, fmt)  # type: ignore[arg-type]
