"""``rgpu trace`` and the embedded span receiver: what they accept, refuse and draw."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from typer.testing import CliRunner

from rgpu_cli.main import app
from rgpu_sim.span_receiver import MAX_EXPORT_BYTES, receiving
from rgpu_sim.spans import SpanRecord, read_spans
from rgpu_sim.trace import find_story, render_story

PROTOBUF = {"Content-Type": "application/x-protobuf"}
SECOND = 1_000_000_000


def record(
    name: str,
    trace: str,
    span: str,
    *,
    parent: str = "",
    start: float,
    end: float,
    uid: str = "",
    pod: str = "trainer-0",
    links: tuple[str, ...] = (),
    status: str = "unset",
    service: str = "rgpu-extender",
) -> dict[str, object]:
    attributes = {"k8s.namespace.name": "ml", "k8s.pod.name": pod} if pod else {}
    if uid:
        attributes["k8s.pod.uid"] = uid
    return {
        "trace_id": trace * 32,
        "span_id": span * 16,
        "parent_id": parent * 16 if parent else "",
        "service": service,
        "name": name,
        "kind": "server",
        "start_ns": int(start * SECOND),
        "end_ns": int(end * SECOND),
        "status": status,
        "message": "",
        "attributes": attributes,
        "links": [{"trace_id": t * 32, "span_id": s * 16, "attributes": {}} for t, s in links],
    }


def story_file(tmp_path: Path) -> Path:
    """An old pod of the same name (uid "old"), then the one that counts (uid "new")."""
    lines = [
        record("POST /mutate", "0", "0", start=1.0, end=1.001, uid="old"),
        record("POST /mutate", "a", "a", start=10.0, end=10.002),
        record("extender.mutate", "a", "b", parent="a", start=10.0005, end=10.001, pod=""),
        record("POST /filter", "c", "c", start=10.5, end=10.52, uid="new", links=("ab",)),
        record(
            "allocate",
            "c",
            "d",
            parent="c",
            start=10.501,
            end=10.519,
            pod="",
            uid="new",
            service="rgpu-allocator",
        ),
        record("POST /bind", "e", "e", start=11.0, end=11.9, uid="new", status="error"),
        record("POST /filter", "f", "f", start=10.6, end=10.7, uid="other", pod="other-pod"),
    ]
    path = tmp_path / "spans.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"cut short')
    return path


def test_the_story_is_the_pods_uid_traces_and_the_creation_they_link_to(tmp_path: Path) -> None:
    story = find_story(read_spans(story_file(tmp_path)), "ml", "trainer-0")

    assert story is not None and story.uid == "new"
    assert [step[0].span.name for step in story.steps] == [
        "POST /mutate",
        "POST /filter",
        "POST /bind",
    ]
    assert [line.depth for line in story.steps[0]] == [0, 1]
    assert story.slowest().name == "POST /bind"


def test_a_pod_only_created_is_its_creation_alone(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(record("POST /mutate", "a", "a", start=1.0, end=1.1)) + "\n")
    story = find_story(read_spans(path), "ml", "trainer-0")
    assert story is not None and story.uid == ""
    assert find_story(read_spans(path), "ml", "nobody") is None


@pytest.mark.parametrize("width", [80, 132])
def test_the_waterfall_fits_the_width_and_marks_the_slowest_step_and_errors(
    tmp_path: Path, width: int
) -> None:
    story = find_story(read_spans(story_file(tmp_path)), "ml", "trainer-0")
    assert story is not None
    lines = [text.plain for text in render_story(story, width=width)]

    assert all(len(line) <= width for line in lines), max(lines, key=len)
    (marked,) = [line for line in lines if line.endswith("◀")]
    assert "POST /bind" in marked and " ERR " in marked and "900.0ms" in marked
    assert any("allocator" in line and "allocate" in line for line in lines)
    steps = render_story(story, width=width, depth=1)
    assert not [text for text in steps if "allocate" in text.plain]
    assert "#" in render_story(story, width=width, unicode=False)[4].plain


def test_piped_output_is_plain_text_within_80_columns(tmp_path: Path) -> None:
    path = story_file(tmp_path)
    result = CliRunner().invoke(app, ["trace", "ml/trainer-0", "--file", str(path)])

    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
    rows = result.output.splitlines()[3:]
    filtered = next(i for i, row in enumerate(rows) if "POST /filter" in row)
    assert filtered < next(i for i, row in enumerate(rows) if "POST /bind" in row)


@pytest.mark.parametrize(
    ("args", "env", "status", "fragment"),
    [
        (["trace", "just-a-name", "--file", "x"], {}, 2, "expected NAMESPACE/NAME"),
        (["trace", "ml/a/b", "--file", "x"], {}, 2, "expected NAMESPACE/NAME"),
        (["trace", "ml/p"], {}, 2, "no span file: pass --file or set RGPU_TRACE_FILE"),
        (["trace", "ml/p"], {"RGPU_TRACE_FILE": "/nonexistent/spans.jsonl"}, 2, "cannot read"),
    ],
)
def test_unusable_arguments_fail_with_one_line_naming_the_fix(
    args: list[str], env: dict[str, str], status: int, fragment: str
) -> None:
    result = CliRunner().invoke(app, args, env=env)

    assert result.exit_code == status
    (line,) = result.output.strip().splitlines()
    assert fragment in line


def test_an_empty_span_file_says_where_spans_went(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    path.touch()
    result = CliRunner().invoke(app, ["trace", "ml/p", "--file", str(path)])

    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert "no spans in" in line and "--otlp-endpoint" in line


def export(*names: str) -> bytes:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    attribute = resource.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", "rgpu-extender"
    scope = resource.scope_spans.add()
    for index, name in enumerate(names):
        span = scope.spans.add()
        span.trace_id, span.span_id = bytes([index + 1]) * 16, bytes([index + 1]) * 8
        span.name, span.kind = name, Span.SpanKind.SPAN_KIND_SERVER
        span.start_time_unix_nano, span.end_time_unix_nano = SECOND, 2 * SECOND
        span.status.code = Status.STATUS_CODE_ERROR
        uid = span.attributes.add()
        uid.key, uid.value.string_value = "k8s.pod.uid", "u-1"
        link = span.links.add()
        link.trace_id, link.span_id = b"\x09" * 16, b"\x09" * 8
    return request.SerializeToString()


@pytest.mark.anyio
async def test_the_receiver_keeps_plain_and_gzipped_exports_as_span_lines(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    async with receiving(path) as url, httpx.AsyncClient(base_url=url) as client:
        plain = await client.post("/v1/traces", content=export("POST /filter"), headers=PROTOBUF)
        zipped = await client.post(
            "/v1/traces",
            content=gzip.compress(export("POST /bind")),
            headers={**PROTOBUF, "Content-Encoding": "gzip"},
        )
    assert (plain.status_code, zipped.status_code) == (200, 200)
    assert plain.headers["content-type"] == "application/x-protobuf"
    spans = read_spans(path)
    assert [s.name for s in spans] == ["POST /filter", "POST /bind"]
    first = spans[0]
    assert first == SpanRecord(
        trace_id="01" * 16,
        span_id="01" * 8,
        parent_id="",
        service="rgpu-extender",
        name="POST /filter",
        kind="server",
        start_ns=SECOND,
        end_ns=2 * SECOND,
        status="error",
        message="",
        attributes={"k8s.pod.uid": "u-1"},
        links=first.links,
    )
    assert [(link.trace_id, link.span_id) for link in first.links] == [("09" * 16, "09" * 8)]


@pytest.mark.anyio
async def test_the_receiver_refuses_what_is_not_an_otlp_export_and_keeps_serving(
    tmp_path: Path,
) -> None:
    path = tmp_path / "spans.jsonl"
    bomb = gzip.compress(b"\0" * (MAX_EXPORT_BYTES + 1))
    async with receiving(path) as url, httpx.AsyncClient(base_url=url) as client:
        answers = [
            await client.post("/v1/traces", json={"resourceSpans": []}),
            await client.post("/v1/traces", content=b"\xff" * 64, headers=PROTOBUF),
            await client.post(
                "/v1/traces", content=b"\0" * (MAX_EXPORT_BYTES + 1), headers=PROTOBUF
            ),
            await client.post(
                "/v1/traces", content=bomb, headers={**PROTOBUF, "Content-Encoding": "gzip"}
            ),
            await client.post(
                "/v1/traces", content=b"not gzip", headers={**PROTOBUF, "Content-Encoding": "gzip"}
            ),
            await client.post("/v1/traces", content=export("POST /filter"), headers=PROTOBUF),
        ]
    assert [a.status_code for a in answers] == [415, 400, 413, 413, 413, 200]
    assert [s.name for s in read_spans(path)] == ["POST /filter"]
