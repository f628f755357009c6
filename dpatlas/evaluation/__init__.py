"""Research on synthetic input: calibration, evaluations, stress scenarios. Never imported by the
release path."""
