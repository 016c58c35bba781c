"""The ``ragline`` command: the composition root, reaching api and workers lazily per command."""
