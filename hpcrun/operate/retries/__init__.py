"""operate/retries/: where a retry is decided: per failure class, retry with a change (more time, more
memory, other nodes) or park; and ``hpcrun retry``, which polls, applies the policy and submits.

The policy is pure (a failed job in, a decision out); both ``hpcrun run`` and ``hpcrun retry`` use it.
"""
