"""Late binding's room: pilots that claim a campaign's inputs from a queue of files (``jobs.binding: late``).

- ``queue.py``: the queue's layout and protocol (claim, commit, fence, place), what the supervisor side
  reads and moves; the pilot's side of the same protocol is ``templates/pilot.sh.j2``.
- ``pilots.py``: the pilots seen by operate as a scheduler (``Pilots`` wraps the real one): tasks go to
  the queue, pilots to the scheduler, records come from the queue.
- ``seats.py``: the clusters a campaign's pilots go to (shares, maintenance drain, hand-off).

The supervisor's care of the pilots each round is ``operate/supervision/pilots.py``; the plan's side
(the pilot's shape and script) is ``plan/job/pilots.py``.
"""
