"""The ``rgpu`` command: run the demo, bring the stack up on the embedded cluster, and look at
what is held by whom (``status``), why a pod waits (``explain``), and what-ifs (``simulate``)."""
