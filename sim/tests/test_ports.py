"""The ports a stack hands its services: free, distinct, and out of the kernel's way."""

from __future__ import annotations

import random
import socket

import pytest

from rgpu_sim.processes import EPHEMERAL_RANGE, LOWEST_PORT, PortPicker


def test_picked_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    picker = PortPicker()
    ports = [picker.take() for _ in range(50)]
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PORT <= port < low for port in ports)


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random.SystemRandom, "randrange", lambda self, n: 0)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        try:
            taken.bind(("127.0.0.1", LOWEST_PORT))
        except OSError:
            pass  # something else holds it already: passed over all the same
        port = PortPicker().take()
    assert port > LOWEST_PORT
