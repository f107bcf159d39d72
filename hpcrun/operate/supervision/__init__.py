"""operate/supervision/: who steers a running campaign: the unattended supervisor (``hpcrun run``:
rounds, lock, lease, heartbeat, stop signals, the event hook) and the operators' commands (cancel,
pause, resume, the audit trail).

The top room of operate/: it calls the others and adds no protocol of its own.
"""
