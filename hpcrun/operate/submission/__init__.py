"""operate/submission/: how work reaches the scheduler: claim -> tag -> record, arrays and batches,
placement on clusters, moves of jobs that wait too long, node locality, the finalize job.

Decides what is sent where and records it before and after sending. Must not read the scheduler's
accounting of ended jobs (tracking/ does) nor decide a retry (retries/ does); a retry's changes reach
it as data on the pending job.
"""
