"""plan/: a validated spec and profile(s) -> a frozen Plan, every decision made (data only, no text).

Rooms, bottom first: intake/ (inputs and their names), then the shared checks, site and values (the
frozen Plan), job/ (the jobs' shapes and what a job reads), budget, build and load. Must not render
text nor touch a plan directory or the store.
"""
