"""rgpu_metrics: exports every remote GPU card once, in HAMi's families and rgpu's own.

It follows discovery's fleet and the allocator's claims by long-poll and renders every scrape
from memory; it never calls the apiserver.
"""

from __future__ import annotations

from rgpu_runtime.feeds import FollowPolicy

from .app import create_app, main

__all__ = ["FollowPolicy", "create_app", "main"]
