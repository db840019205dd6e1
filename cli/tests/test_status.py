"""``rgpu status`` over real HTTP (a loopback server answering as discovery and the allocator):
a summary and one line per server by default, one per card with ``-o wide``, JSON with
``-o json``, filters, and nothing cut at 80 columns or piped."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from typer.testing import CliRunner

import rgpu_testkit as testkit
from rgpu_cli.main import app
from rgpu_contracts import ClaimState, PodRef, PodUID
from rgpu_testkit import flat

ENDPOINT = "10.200.100.17:14833"
HOLDER = PodRef(uid=PodUID("uid-1"), namespace="ml-team-with-a-long-name", name="trainer-0042")


def sources() -> dict[str, bytes]:
    servers = [testkit.server(name="gpu-01", cards=4, endpoint=ENDPOINT)]
    servers += [testkit.server(name=f"gpu-{i:02d}", cards=4) for i in range(2, 51)]
    claims = [
        testkit.claim(server="gpu-01", cards=(0, 1, 2, 3), pod=HOLDER, state=ClaimState.BOUND)
    ]
    return {
        "/v1/fleet": json.dumps(testkit.fleet(servers=servers, revision=7).to_dict()).encode(),
        "/v1/claims": json.dumps(testkit.claim_set(claims=claims).to_dict()).encode(),
    }


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    answers = sources()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.get(self.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body or b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def status(url: str, *args: str) -> tuple[int, str]:
    sources = ("--discovery-url", url, "--allocator-url", url)
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["status", *sources, *args])
    return result.exit_code, result.output


def test_the_default_is_a_summary_and_one_line_per_server(url: str) -> None:
    code, output = status(url)
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0] == ("50 servers, 200 cards: 196 free, 4 held; 1 claims (fleet revision 7)")
    assert lines[1].split() == ["SERVER", "ENDPOINT", "CUDA", "CARDS", "STATES", "HOLDERS"]
    assert len(lines) == 2 + 50
    # Nothing is cut at 80 columns: the endpoint and the holder are whole, on their row.
    assert lines[2].split() == ["gpu-01", ENDPOINT, "-", "4", "4", "bound", HOLDER.key]


def test_wide_is_one_whole_line_per_card(url: str) -> None:
    code, output = status(url, "-o", "wide", "--server", "gpu-01")
    assert code == 0, output
    lines = output.splitlines()
    assert lines[1].split()[:5] == ["SERVER", "ENDPOINT", "CUDA", "CARD", "UUID"]
    assert len(lines) == 2 + 4
    uuid = testkit.gpu_uuid(server="gpu-01", index=0)
    assert uuid in lines[2] and HOLDER.key in lines[2]


def test_json_is_every_card_shown_with_its_state_and_holder(url: str) -> None:
    code, output = status(url, "-o", "json", "--state", "held")
    assert code == 0, output
    body = json.loads(output)
    assert (body["fleetRevision"], body["claims"]) == (7, 1)
    assert {(c["server"], c["index"], c["state"], c["holder"]) for c in body["cards"]} == {
        ("gpu-01", i, "bound", HOLDER.key) for i in range(4)
    }


def test_filters_by_state_and_holder_apply_before_the_summary(url: str) -> None:
    code, output = status(url, "--state", "free", "--server", "gpu-02", "--server", "gpu-03")
    assert code == 0, output
    assert output.splitlines()[0].startswith("2 servers, 8 cards: 8 free, 0 held")
    code, output = status(url, "--holder", HOLDER.key, "-o", "json")
    assert len(json.loads(output)["cards"]) == 4


def test_an_unknown_state_is_a_usage_error_listing_the_states(url: str) -> None:
    code, output = status(url, "--state", "fre")
    assert code == 2
    assert "fre: expected one of unavailable" in flat(output)


def test_an_unreachable_source_names_the_url_and_the_variable_to_set() -> None:
    result = CliRunner().invoke(
        app, ["status", "--discovery-url", "http://127.0.0.1:9", "--allocator-url", "http://x"]
    )
    assert result.exit_code == 2
    text = flat(result.output)
    assert "cannot read http://127.0.0.1:9/v1/fleet" in text
    assert "rgpu up --sim" in text
    assert "set RGPU_DISCOVERY_URL or --discovery-url" in text
    assert "Traceback" not in result.output
