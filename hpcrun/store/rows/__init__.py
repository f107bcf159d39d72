"""store/rows/: the store's queries by concern (claims, observations, failures, exports, generations,
spans, supervision, control), each a part of :class:`hpcrun.store.store.StateStore`."""
