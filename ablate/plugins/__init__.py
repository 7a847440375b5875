"""Plugins: architectures and objectives from outside the package, registered through the same API as the zoo.

    api.py     `ablate.architecture` and `ablate.objective`: register a builder (the built-ins use their lazy form)
    load.py    a sweep's `plugins:` (a file beside the sweep, or an importable module), installed packages'
               entry points (group `ablate.plugins`), and the identity of each one's code
    stored.py  a file plugin's source kept in the results DB by its identity, and materialised on a worker
    recorded.py  what readers know of a plugin without running it (facts recorded at registration)
    check.py   the contract suite (`ablate check`): shape, causality, parameter count, training, DDP

Torch-free except check.py: reading and planning a sweep with plugins imports no torch unless a plugin does.
"""
