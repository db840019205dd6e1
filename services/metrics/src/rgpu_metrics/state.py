"""Handlers reach what the lifespan built through one typed accessor."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from rgpu_runtime import state_value

from .board import Board

__all__ = ["Deps", "State", "deps"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deps:
    """What request handlers need: the board to render and the app's own registry."""

    board: Board
    registry: CollectorRegistry


class State(TypedDict):
    """The lifespan's state mapping."""

    deps: Deps


def deps(request: Request) -> Deps:
    """The lifespan's ``Deps`` for this request; raises ``RuntimeError`` if it did not run."""
    return state_value(request, "deps", Deps)
