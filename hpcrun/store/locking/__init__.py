"""store/locking/: who may write: the submit and supervisor locks, the lease epochs every write checks
(fencing), and whether locks hold on the filesystem the store is on (network filesystems)."""
