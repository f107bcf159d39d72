"""store/sql/: the store's schema, every version of it, and its column types. No queries here."""
