"""kvtier: a tiered store for the KV-cache blocks of LLM serving engines."""
