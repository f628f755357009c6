"""Column names of the estimate table that the publication reads (here, so that publishing
files does not import the estimation code)."""

RESULT_COLUMNS = ["geoid", "cell", "n", "mechanism", "status", "reason", "p25_raw", "p75_raw",
                  "epsilon_spent", "delta_spent"]
INTERVAL_COLUMNS = ["p25_lo", "p25_hi", "p75_lo", "p75_hi"]
# The interval-implied standard errors beside the intervals (post-processing of the interval step).
SE_COLUMNS = ["p25_se", "p75_se"]
