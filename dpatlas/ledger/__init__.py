"""The privacy budget ledger: the Ledger and its rules (store.py), made of its database
(backend.py), tables (schema.py), caps and spend (caps.py), releases (releases.py), leases
(leases.py) and reads (reading.py); the charges of a plan (charges.py), the checks of its inputs
(validation.py), what it prints (formatting.py) and its refusals (errors.py).

``from dpatlas.ledger import Ledger`` and the other public names work as before the split."""

from dpatlas.ledger.charges import Charge, charges
from dpatlas.ledger.errors import (BudgetExceeded, CapBelowSpent, InvalidLedgerId,
                                   InvalidLedgerReason, LeaseLost, LedgerError, ReleaseBusy)
from dpatlas.ledger.leases import Lease
from dpatlas.ledger.backend import redact_url
from dpatlas.ledger.formatting import display_text
from dpatlas.ledger.schema import GUARANTEE_TYPES, STATUSES
from dpatlas.ledger.store import Ledger
from dpatlas.ledger.validation import check_cap

__all__ = ["LedgerError", "BudgetExceeded", "CapBelowSpent", "ReleaseBusy", "LeaseLost",
           "InvalidLedgerId", "InvalidLedgerReason", "Charge", "Ledger", "Lease",
           "GUARANTEE_TYPES", "STATUSES", "charges", "check_cap", "display_text", "redact_url"]
