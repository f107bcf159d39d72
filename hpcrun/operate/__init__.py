"""operate/: a plan directory run as a campaign, after ``hpcrun plan`` wrote it.

Decides what is sent to the scheduler, what its answers mean, what is retried, and what the supervisor
and the operators do. Reads the plan only through its manifest (``manifest.py``, the one contract with
plan/ and render/) and records only through the store; never plans, renders or validates a spec.

Shared here: ``manifest`` (the typed manifest), ``plandir`` (a plan directory's store and clusters),
``results`` (what commands return), ``metrics`` (the Prometheus text). The rooms, bottom first:
campaign, outputs, submission, tracking, retries, supervision (tests/test_layers.py keeps the order).
"""
