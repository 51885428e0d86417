"""``gate init``: gate.yaml, an update hook and a prompt set from an RL stack's own config.

:mod:`gate.init.sources` reads the stack's config (YAML, TOML, Hydra overrides, argparse flags) into
one flat dict; :mod:`gate.init.stacks` says where each of nine stacks keeps what gate.yaml needs;
:mod:`gate.init.mapping` fills the fields and reports what it could not; :mod:`gate.init.writer`
writes the annotated gate.yaml; :mod:`gate.init.dataset` freezes a prompt set from the stack's
dataset; :mod:`gate.init.recipes` holds the stacks' weight pushes as hooks.
"""
