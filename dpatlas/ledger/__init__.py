"""The privacy budget ledger: its store, charges and leases."""
