from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

from rgpu_runtime.telemetry._logging import configure_logging


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_time_severity_logger_message_and_extras() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream)
    logging.getLogger("rgpu.test").info("bound %s", "p-0", extra={"node": "n1", "pod": "ns/p-0"})
    entry = json.loads(stream.getvalue())
    assert entry["severity"] == "INFO"
    assert entry["logger"] == "rgpu.test"
    assert entry["message"] == "bound p-0"
    assert (entry["node"], entry["pod"]) == ("n1", "ns/p-0")
    assert entry["time"].endswith("+00:00")
    assert "trace_id" not in entry


def test_json_lines_name_the_active_trace() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream)
    with TracerProvider().get_tracer("t").start_as_current_span("s") as span:
        logging.getLogger("rgpu.test").warning("inside")
    entry = json.loads(stream.getvalue())
    assert entry["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert entry["span_id"] == f"{span.get_span_context().span_id:016x}"


def test_json_keeps_the_traceback_in_one_line() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream)
    try:
        raise ValueError("bad thing")
    except ValueError:
        logging.getLogger("rgpu.test").exception("failed")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "ValueError: bad thing" in json.loads(lines[0])["exception"]


def test_records_below_the_level_are_dropped() -> None:
    stream = io.StringIO()
    configure_logging("WARNING", "json", stream=stream)
    logging.getLogger("rgpu.test").info("quiet")
    assert stream.getvalue() == ""


def test_text_format_is_readable() -> None:
    stream = io.StringIO()
    configure_logging("DEBUG", "text", stream=stream)
    logging.getLogger("rgpu.test").debug("hello %d", 3)
    assert stream.getvalue().rstrip().endswith("DEBUG   rgpu.test: hello 3")


def test_configuring_twice_does_not_duplicate_lines() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream)
    configure_logging("INFO", "json", stream=stream)
    logging.getLogger("rgpu.test").info("once")
    assert len(stream.getvalue().splitlines()) == 1
