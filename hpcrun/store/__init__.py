"""store/: the campaign's state (SQLite by default, PostgreSQL shared): inputs, claims, submissions,
observations, leases, the audit trail.

Rooms, bottom first: sql/ (the schema), records (the rows as values), locking/ (who may write), base and
queries, rows/ (the queries by concern), store (StateStore and opening a store). Must not ask the
scheduler or read a plan directory: operate/ hands it what to record.
"""
