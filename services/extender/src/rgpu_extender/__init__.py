"""rgpu's kube-scheduler extender (filter, prioritize, bind) and mutating admission webhook."""

from __future__ import annotations

from .app import create_app, listeners, main

__all__ = ["create_app", "listeners", "main"]
