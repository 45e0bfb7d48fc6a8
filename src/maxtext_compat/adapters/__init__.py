"""Wrapper classes that keep MaxText's old signatures and add the kv_cache/attention_metadata path."""
