"""Rendering report.json (docs/report.md) as Markdown: the PR comment, the job summary, the artifact.

``gate.render.markdown`` holds the public functions; they take a :class:`gate.report_model.Report`,
which is where a report is loaded and checked. ``sections`` builds the parts, ``charts`` draws the GRPO
trajectories, ``escape`` makes untrusted text inert and ``budget`` fits the text under GitHub's limits.
"""
