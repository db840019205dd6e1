"""rgpu discovery: watches lupine server Nodes, probes them, publishes the fleet and topology.

``create_app(settings)`` builds the ASGI app; ``python -m rgpu_discovery`` serves it.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
