"""rgpu allocator: chooses a lupine server for a pod and books it durably in Leases.

``create_app(settings)`` builds the ASGI app; ``python -m rgpu_allocator`` serves it.
"""

from __future__ import annotations

from .app import create_app

__all__ = ["create_app"]
