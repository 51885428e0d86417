"""The ``gate`` commands, one module per family; :mod:`gate.cli` builds the parser from them.

- ``run``: ``gate run``, ``key``, ``check`` and ``prepare``.
- ``baseline``: ``gate calibrate`` and ``gate baseline record|update``.
- ``repeat``: ``gate repeat``.
- ``prompts``: ``gate prompts freeze``.
- ``report``: ``gate report`` and ``gate merge``.
- ``github``: ``gate comment`` and ``gate publish``.
- ``common``: what they share: the config arguments, loading the config they name, logging, and
  :func:`~gate.commands.common.route_to_gate_image`, the one place that decides whether an
  engine-running command re-runs itself in the gate image.

Each module's ``add_<command>`` functions add one subcommand whose ``func`` default runs it. The
library (everything else under ``gate/``) never imports this package.
"""
