"""Tasks that the launchers' example configs train on (Shakespeare, offline)."""
