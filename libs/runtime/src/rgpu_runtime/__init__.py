"""rgpu_runtime: the thin plumbing every rgpu service shares, in rooms by concern.

Each room is a sub-package whose ``__all__`` is what the services, the CLI and the libraries
import from it; everything else stays private to the room. From the top floor down (a room
imports only rooms below it; ``.importlinter`` holds them to it):

* ``replicas``: leader election and membership through Leases.
* ``serving``: the app factory, the HTTP edge, listeners, draining and ``run_service``.
* ``feeds``: the long-poll feeds, their publishers' snapshots and their followers' mirrors.
* ``peers``: HTTP between the services and the tokens that authenticate it.
* ``kube``: the Kubernetes client, list+watch reflectors and Events.
* ``telemetry``: logging, tracing, latency and a pod's story.
* ``settings``: the settings pieces and the one list of known keys.
* ``pacing``: backoff and token buckets.

The error tree is ``rgpu_runtime.errors``, below every room.
"""
