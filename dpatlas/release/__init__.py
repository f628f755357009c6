"""The stages of one release (ingest, validate, contributions, plan, selection, estimate, manifest),
its run state and its outcome."""
