"""GitHub integration: the sticky PR comment, the job summary, step outputs and annotations.

- ``client``: a small REST client (httpx) with retries, pagination and one-line errors.
- ``event``: the repository and PR number from the Actions environment.
- ``comment``: one sticky comment per gate id, found by its hidden marker.
- ``actions``: ``$GITHUB_STEP_SUMMARY``, ``$GITHUB_OUTPUT`` and workflow annotations.

The commands that use them, ``gate comment`` and ``gate publish``, live in :mod:`gate.commands.github`.
"""
