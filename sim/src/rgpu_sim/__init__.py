"""The proving ground: the whole system on the simulated cluster (``rgpu demo``, ``rgpu up
--sim``, ``env``, ``down``), the long run under injected faults with an independent verdict
(``rgpu soak``), the what-ifs replayed through the allocator's decision code (``rgpu
simulate``) and a pod's story from the spans a stack kept (``rgpu trace``). A package apart
from the operator's ``rgpu_cli`` so that the operator's command installs without the simulator
and the services; its commands join ``rgpu`` through the ``rgpu.commands`` entry points."""
