"""The metrics service raises no errors of its own, and this module says why.

Its two peers (discovery for the fleet, the allocator for the claims) are followed by
``rgpu_runtime.feeds.Follower``, which turns every failure of a call, httpx errors included,
into its ``FollowStatus`` (``rgpu_source_up``, ``rgpu_source_age_seconds``) and backs off; the
last good snapshot keeps being exported meanwhile, so nothing is left to raise. A scrape
renders from memory and cannot fail on a peer. Whatever else goes wrong is runtime's tree
(``rgpu_runtime.errors``), answered by the shared service edge.

Hierarchy::

    RgpuError (rgpu_runtime.errors)    nothing of the metrics service's own below it
"""

from __future__ import annotations

__all__: list[str] = []
