"""Privacy machinery shared by every generator: the accountants and the exact loss they are held to, the
run's secret and counter-based randomness, the release choice, the lifetime composition of releases,
the privacy statement and the empirical audits."""
