"""operate/outputs/: what finished jobs wrote: their QA rows, the provenance record of each output,
and the supervisor's verified copies to ``outputs.export``.

Must not decide a job's state or a retry: it is given the jobs that ended and records what they left.
"""
