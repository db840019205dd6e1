"""The operator's ``rgpu`` command: what is held by whom (``status``), why a pod waits
(``explain``, ``queue``), and running the pool (``cordon``, ``drain``, ``usage``). The proving
ground's commands (``demo``, ``up --sim``, ``soak``, ``simulate``) are the rgpu-sim package's and
join it when that is installed (``proving_ground``)."""
