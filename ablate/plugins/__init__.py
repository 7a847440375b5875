"""Plugins: architectures and objectives from outside the package, registered through the same API as the zoo.

    load.py    a sweep's `plugins:` (a file beside the sweep, or an importable module), installed packages'
               entry points (group `ablate.plugins`); what each registers goes through config/registration.py
    stored.py  what registering a sweep stores of its plugins (`records_of`), and a file plugin's source
               materialised on a worker from the results DB
    recorded.py  what readers know of a plugin without running it (facts recorded at registration)
    check.py   the contract suite (`ablate check`): shape, causality, parameter count, training, DDP

Torch-free except check.py: reading and planning a sweep with plugins imports no torch unless a plugin does.
"""
