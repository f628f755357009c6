"""The privacy budget ledger: its store (store.py: the Ledger, its tables and rules), the
charges of a plan (charges.py), release leases (leases.py) and its refusals (errors.py).

``from dpatlas.ledger import Ledger`` and the other public names work as before the split."""

from dpatlas.ledger.charges import Charge, charges
from dpatlas.ledger.errors import (BudgetExceeded, CapBelowSpent, InvalidLedgerId,
                                   InvalidLedgerReason, LeaseLost, LedgerError, ReleaseBusy)
from dpatlas.ledger.leases import Lease
from dpatlas.ledger.store import (GUARANTEE_TYPES, STATUSES, Ledger, check_cap, display_text,
                                  redact_url)

__all__ = ["LedgerError", "BudgetExceeded", "CapBelowSpent", "ReleaseBusy", "LeaseLost",
           "InvalidLedgerId", "InvalidLedgerReason", "Charge", "Ledger", "Lease",
           "GUARANTEE_TYPES", "STATUSES", "charges", "check_cap", "display_text", "redact_url"]
