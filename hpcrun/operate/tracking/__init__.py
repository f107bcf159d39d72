"""operate/tracking/: where a scheduler's answer becomes a recorded state: one poll of the queue and
accounting for the jobs in flight, the daemons that do not answer (outages), jobs held by a spent
allocation, each cluster's figures.

Must not submit or retry: it records what it sees and reports it.
"""
