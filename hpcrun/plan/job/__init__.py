"""plan/job/: the jobs' shapes and what a job reads: grouping into jobs, their requests, burst-buffer
sizes, commands, the database, the container, staging or reading in place, checksums, exports, and
large list files made into jobs a block at a time.

Decides values only; the text is render/'s.
"""
