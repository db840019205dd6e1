"""The board renders lazily and per server: unchanged servers are reused, gone ones vanish."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from rgpu_metrics import board as board_module
from rgpu_metrics.board import Board


def servers_in(board: Board) -> list[str]:
    text = b"".join(board.block().parts(openmetrics=False)).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return [s.labels["server"] for s in families["rgpu_server_cards"].samples]


def counting_renders(monkeypatch) -> list[str]:
    rendered: list[str] = []
    real = board_module.render_server

    def render(server, claims):
        rendered.append(server.name)
        return real(server, claims)

    monkeypatch.setattr(board_module, "render_server", render)
    return rendered


def test_an_empty_board_renders_headers_only():
    assert servers_in(Board()) == []


def test_the_block_is_cached_until_a_source_changes(make):
    board = Board()
    board.set_fleet(make.fleet(make.server("gpu-a")))
    first = board.block()
    assert board.block() is first
    board.set_claims(make.claims())
    assert board.block() is not first


def test_only_servers_whose_value_or_claims_changed_are_rendered_again(make, monkeypatch):
    rendered = counting_renders(monkeypatch)
    board = Board()
    board.set_fleet(make.fleet(make.server("gpu-a"), make.server("gpu-b")))
    board.set_claims(make.claims(make.claim("gpu-a", [0])))
    board.block()
    assert sorted(rendered) == ["gpu-a", "gpu-b"]
    rendered.clear()
    board.set_claims(make.claims(make.claim("gpu-a", [0], state="booked")))
    board.block()
    assert rendered == ["gpu-a"]
    rendered.clear()
    board.set_fleet(make.fleet(make.server("gpu-a"), make.server("gpu-b"), revision=2))
    board.block()
    assert rendered == []


def test_a_server_missing_from_the_new_fleet_disappears(make):
    board = Board()
    board.set_fleet(make.fleet(make.server("gpu-b"), make.server("gpu-a")))
    assert servers_in(board) == ["gpu-a", "gpu-b"]
    board.set_fleet(make.fleet(make.server("gpu-a"), revision=2))
    assert servers_in(board) == ["gpu-a"]


def test_a_server_listed_twice_is_exported_once(make):
    board = Board()
    board.set_fleet(make.fleet(make.server("gpu-a", cards=2), make.server("gpu-a", cards=5)))
    assert servers_in(board) == ["gpu-a"]
    text = b"".join(board.block().parts(openmetrics=False)).decode()
    assert 'rgpu_server_cards{server="gpu-a"} 2\n' in text


def test_the_last_fleet_and_claims_stay_readable(make):
    board = Board()
    fleet, claims = make.fleet(make.server("gpu-a")), make.claims(revision=4)
    board.set_fleet(fleet)
    board.set_claims(claims)
    assert (board.fleet, board.claims) == (fleet, claims)
