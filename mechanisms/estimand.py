"""What every published tract value, interval and standard error estimates (issue 32).

One estimand for the whole map, direct and model values alike: the tract's *expected outcome*,
the population least-squares prediction of a child's rank at parent rank x* (0.25 for p25,
0.75 for p75) under the law that generated the tract's records. It is what the Opportunity
Atlas's tract estimates and standard errors address (Chetty et al. 2018, "The Opportunity
Atlas", §III: the tract's expected rank given parents at the 25th percentile), and what the
small-area model targets. Uncertainty columns cover the *total error* around it: the sampling
error of the tract's finite sample and the privacy noise of the release.

The strings below are the single source of the wording: the manifest, the table schema, the
codebook, the web map's legend and popups, and ``dpatlas audit`` (which checks that every
interval and SE column declares ``ESTIMAND_ID``) read them from here.
"""

from __future__ import annotations

# A short, stable identifier every interval/SE column's description carries.
ESTIMAND_ID = "tract expected outcome"

ESTIMAND = (
    "tract expected outcome: the population least-squares prediction of a child's income rank "
    "at the parent rank (0.25 for p25, 0.75 for p75) under the law that generated the tract's "
    "records, i.e. the average rank the tract's children with parents at that rank are expected "
    "to reach; clipped to [0, 1]")

TOTAL_ERROR = "total error (sampling error of the tract's records and privacy noise)"

INTERVAL_MEANING = (
    f"confidence interval for the {ESTIMAND_ID}, covering the {TOTAL_ERROR}")
SE_MEANING = (
    f"standard error: the estimated standard deviation of the published value's {TOTAL_ERROR} "
    f"around the {ESTIMAND_ID}, from DP and public values only; 0.5 means the direct value "
    "carries no usable information")
MOE90_MEANING = (
    f"90% margin of error (1.645 x the standard error, rounded up): value ± this is the 90% "
    f"range for the {ESTIMAND_ID} under a normal reading of the {TOTAL_ERROR}")

# value ± MOE90_Z·se: the 90% margin of error beside the standard error (normal reading).
MOE90_Z = 1.6448536269514722
# The largest published standard error: the error of a value in [0, 1] about a target in
# [0, 1] has a root-mean-square of at most 1, and ±1.96·0.5 already spans [0, 1] from any
# value; a larger SE says nothing more.
SE_CAP = 0.5
