"""Every endpoint that reads a JSON body, fed what an attacker or a broken client would send.

Valid bodies (the wire fixtures, and the contracts' shapes for the allocator) are mutated field
by field: a field removed, or replaced by a wrong type, null, a huge string, a huge, negative or
fractional number, a number Python cannot even parse, deep nesting. Arbitrary JSON and bytes
come next, then fixed nasty bodies (100,000-deep nesting, thousands of digits, invalid UTF-8, a
16 MiB body, an empty one) and wrong content types. The stack's judge (``Stack.send``) holds
the properties: below 500, an answer within the bound, the service ready after; here a valid
body must also still be served after each fuzzed one. The verbs kube-scheduler calls answer
``/filter`` and ``/bind`` with 200 and ``Error``, or a 4xx.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio

FUZZ = settings.get_profile("rgpu-fuzz")
BODY_ENDPOINTS: dict[str, tuple[str, str]] = {
    "POST /filter": ("extender", "/filter"),
    "POST /prioritize": ("extender", "/prioritize"),
    "POST /bind": ("extender", "/bind"),
    "POST /mutate": ("extender", "/mutate"),
    "POST /v1/allocations": ("allocator", "/v1/allocations"),
    "POST /v1/allocations/{uid}/commit": ("allocator", "/v1/allocations/{uid}/commit"),
}
ERROR_IN_BODY = ("POST /filter", "POST /bind")
"""kube-scheduler loses the reason of any non-200 from these, so they carry it in ``Error``."""
JSON = {"content-type": "application/json"}
NASTY = (
    "empty",
    "null",
    "array-100k-deep",
    "object-100k-deep",
    "number-5000-digits",
    "invalid-utf8",
    "nan",
    "truncated",
    "16MiB",
)
UID = "fuzz-seeded-pod-uid"
"""Stands for the seeded pod's uid (known only once kubesim created it) in valid bodies."""
CONTENT_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "")


class Raw(str):
    """JSON text sent as is: numbers Python could not even print, ``NaN``, deep nesting."""


DELETE = Raw("")
"""A mutation that removes the field instead of replacing it."""
DIGITS = "9" * 5000
"""More digits than Python's ``int()`` accepts (4300): the digit-count bug class."""
DEEP = 100_000
NASTY_VALUES: tuple[object, ...] = (
    DELETE,
    None,
    True,
    0,
    -1,
    1.5,
    -0.0,
    2**31,
    2**63,
    2**64,
    1e308,
    "",
    "-1",
    "1.5",
    "1e3",
    "NaN",
    "0x10",
    "x" * 70_000,
    DIGITS,
    "\u0000",
    "\ud800",
    [],
    {},
    [None],
    {"": None},
    Raw(DIGITS),
    Raw("-" + DIGITS),
    Raw("1e999999"),
    Raw("0." + "0" * 5000 + "1"),
    Raw("NaN"),
    Raw("[" * 5000 + "]" * 5000),
    Raw('{"a":' * 5000 + "1" + "}" * 5000),
)
"""Replacements for a field: wrong types, empty, huge, negative, fractional and nested values."""


def encode(value: object) -> bytes:
    """JSON bytes for ``value``, ``Raw`` text verbatim; lone surrogates become invalid UTF-8."""
    return _text(value).encode("utf-8", "surrogatepass")


def _text(value: object) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_text(str(k))}:{_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


Pointer = tuple[str | int, ...]


def paths(value: object, prefix: Pointer = ()) -> list[Pointer]:
    """Every field of a JSON document (object members and array items), parents first."""
    if isinstance(value, dict):
        children: list[tuple[str | int, object]] = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    else:
        return []
    found: list[Pointer] = []
    for key, child in children:
        found.append((*prefix, key))
        found.extend(paths(child, (*prefix, key)))
    return found


def mutate(document: object, mutations: Sequence[tuple[Pointer, object]]) -> object:
    """A copy of ``document`` with each ``(path, value)`` applied (``DELETE`` removes); a path
    an earlier mutation removed is skipped."""
    result = copy.deepcopy(document)
    for path, value in mutations:
        parent: Any = result
        for key in path[:-1]:
            if not _has(parent, key):
                break
            parent = parent[key]
        else:
            if _has(parent, path[-1]):
                if value is DELETE:
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = value
    return result


def _has(container: object, key: str | int) -> bool:
    if isinstance(container, dict):
        return key in container
    return isinstance(container, list) and isinstance(key, int) and key < len(container)


def json_values() -> st.SearchStrategy[object]:
    """Arbitrary JSON values, small: the random-JSON part of the fuzz."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(2**70), max_value=2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20)
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def field_values() -> st.SearchStrategy[object]:
    """What a mutation puts into a field: a nasty value, or any small JSON value."""
    return st.sampled_from(NASTY_VALUES) | json_values() | st.text(max_size=40)


@dataclass(frozen=True, slots=True)
class Mutations:
    """Fields to replace or remove: ``(index, value)``, the index taken modulo the number of
    fields of the endpoint's valid body, so one strategy serves every endpoint."""

    changes: tuple[tuple[int, object], ...]

    def body(self, template: object) -> bytes:
        fields = paths(template)
        return encode(mutate(template, [(fields[i % len(fields)], v) for i, v in self.changes]))


@dataclass(frozen=True, slots=True)
class Verbatim:
    """A body sent as drawn: arbitrary JSON or arbitrary bytes."""

    data: bytes

    def body(self, template: object) -> bytes:
        return self.data


def shapes() -> st.SearchStrategy[Mutations | Verbatim]:
    """Mostly mutated valid bodies, then arbitrary JSON, then arbitrary bytes."""
    change = st.tuples(st.integers(min_value=0, max_value=10_000), field_values())
    mutations = st.lists(change, min_size=1, max_size=3).map(lambda c: Mutations(tuple(c)))
    return st.one_of(
        mutations,
        mutations,
        json_values().map(lambda v: Verbatim(encode(v))),
        st.binary(max_size=64).map(Verbatim),
    )


def nasty_bodies(template: object) -> dict[str, bytes]:
    """Fixed bodies every endpoint must refuse or survive, by name."""
    valid = encode(template)
    return {
        "empty": b"",
        "null": b"null",
        "array-100k-deep": b"[" * DEEP + b"]" * DEEP,
        "object-100k-deep": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
        "number-5000-digits": DIGITS.encode(),
        "invalid-utf8": b'{"a": "\xff\xfe\xc0"}',
        "nan": b'{"a": NaN}',
        "truncated": valid[: len(valid) // 2],
        "16MiB": _padded(template),
    }


def _padded(template: object) -> bytes:
    """``template`` grown to 16 MiB by one extra member, so it stays valid JSON."""
    if not isinstance(template, dict):
        return b"[" + b'"x",' * (4 << 20) + b'"x"]'
    # Spliced as bytes: JSON-encoding a 16 MiB string per case was most of this suite's time.
    members = encode(template)[1:-1]
    return b"{" + members + (b"," if members else b"") + b'"padding":"' + b"x" * (16 << 20) + b'"}'


def _templates() -> dict[str, object]:
    """A valid body per endpoint from the wire fixtures and the allocator's contracts; the
    seeded pod's uid is filled in when a body is sent."""
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "k8s"

    def load(name: str) -> Any:
        return json.loads((fixtures / name).read_text())

    filter_args = load("extender-filter-args.json")
    pod = {**filter_args["Pod"], "metadata": {**filter_args["Pod"]["metadata"], "uid": UID}}
    return {
        "POST /filter": {**filter_args, "Pod": pod},
        "POST /prioritize": {**load("extender-prioritize-args.json"), "Pod": pod},
        "POST /bind": {**load("extender-bind-args.json"), "PodUID": UID},
        "POST /mutate": load("admission-review-pod-create.json"),
        "POST /v1/allocations": {
            "pod": {"uid": UID, "namespace": "ml-team", "name": "trainer-0"},
            "containers": [{"name": "trainer", "kind": "app", "count": 1, "memoryMiB": 1024}],
            "candidateNodes": ["gpu-node-1", "cpu-node-1"],
            "dryRun": False,
        },
        "POST /v1/allocations/{uid}/commit": {"node": "gpu-node-1"},
    }


TEMPLATES = _templates()


async def _post(stack: Any, endpoint: str, body: bytes, headers: dict[str, str] = JSON) -> Any:
    service, route = BODY_ENDPOINTS[endpoint]
    path = route.replace("{uid}", stack.uid)
    body = body.replace(UID.encode(), stack.uid.encode())
    return await stack.call(service, "POST", route, path=path, body=body, headers=headers)


def _judge(endpoint: str, reply: Any) -> None:
    """The verb's own rule on top of the stack's: ``Error`` in a 200, or a 4xx."""
    response = reply.response
    if response is None or endpoint not in ERROR_IN_BODY:
        return
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
    if response.status_code == 200:
        assert isinstance(response.json().get("Error"), str), response.text


@pytest.mark.parametrize("endpoint", list(BODY_ENDPOINTS))
@FUZZ
@given(shape=shapes())
async def test_json_endpoint_never_fails_on_mutated_or_random_bodies_nor_after_them(
    stack: Any, endpoint: str, shape: Mutations | Verbatim
) -> None:
    reply = await _post(stack, endpoint, shape.body(TEMPLATES[endpoint]))
    _judge(endpoint, reply)
    # --hypothesis-show-statistics tells how deep the inputs got: refused, answered, known bug.
    event(f"known bug {reply.known.id}" if reply.known else f"HTTP {reply.response.status_code}")
    if endpoint != "POST /bind":
        # Ready is not enough: whatever the input left behind, a valid body is still served.
        # (Not /bind: once the pod is bound its claim is gone and every valid bind waits half
        # a second for the Lease watch before it answers; the next examples would crawl.)
        _judge(endpoint, await _post(stack, endpoint, encode(TEMPLATES[endpoint])))


@pytest.mark.parametrize("nasty", NASTY)
@pytest.mark.parametrize("endpoint", list(BODY_ENDPOINTS))
async def test_json_endpoint_refuses_nasty_body_without_failing(
    stack: Any, endpoint: str, nasty: str
) -> None:
    body = nasty_bodies(TEMPLATES[endpoint])[nasty]
    _judge(endpoint, await _post(stack, endpoint, body))


@pytest.mark.parametrize("content_type", CONTENT_TYPES)
@pytest.mark.parametrize("endpoint", list(BODY_ENDPOINTS))
async def test_json_endpoint_survives_a_valid_body_sent_with_another_content_type(
    stack: Any, endpoint: str, content_type: str
) -> None:
    body = encode(TEMPLATES[endpoint])
    _judge(endpoint, await _post(stack, endpoint, body, {"content-type": content_type}))


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
async def test_metrics_exposition_still_parses_after_the_bodies_above(
    stack: Any, accept: str
) -> None:
    # Runs after the fuzz in this module: whatever the allocator booked from fuzzed pod names
    # and namespaces reaches the exporter's label values, escaped or not.
    reply = await stack.call("metrics", "GET", "/metrics", headers={"accept": accept})
    parse = openmetrics_families if accept else text_string_to_metric_families
    assert list(parse(reply.response.text))
