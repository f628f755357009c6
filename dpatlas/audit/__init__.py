"""The independent audit of a published release (imports nothing of ours)."""
