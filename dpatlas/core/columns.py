"""Column names of the estimate table that the publication reads (here, so that publishing
files does not import the estimation code)."""

RESULT_COLUMNS = ["geoid", "cell", "n", "mechanism", "status", "reason", "p25_raw", "p75_raw",
                  "epsilon_spent", "delta_spent"]
INTERVAL_COLUMNS = ["p25_lo", "p25_hi", "p75_lo", "p75_hi"]
# The standard errors of the total error, drawn-for by the interval step beside its bounds
# (mechanisms/intervals.py, mechanisms/estimand.py).
SE_COLUMNS = ["p25_se", "p75_se"]
# What the estimate tables carry from the interval step.
UNCERTAINTY_COLUMNS = INTERVAL_COLUMNS + SE_COLUMNS
# The 90% margins of error the files publish beside the standard errors (post-processing).
MOE_COLUMNS = ["p25_moe90", "p75_moe90"]
