"""Names of things that must not be mixed up, checked by mypy.

A ``CardId`` is ``<server node name>/<GPU UUID>``; a ``GpuUuid`` is the bare UUID lupine reports.
"""

from __future__ import annotations

from typing import NewType

__all__ = ["CardId", "GpuUuid", "NodeName", "PodUID", "ServerName"]

NodeName = NewType("NodeName", str)
ServerName = NewType("ServerName", str)
GpuUuid = NewType("GpuUuid", str)
CardId = NewType("CardId", str)
PodUID = NewType("PodUID", str)
