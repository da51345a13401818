"""Data files shipped with kvtier (a real KV-cache request trace; see NOTICE.md)."""
