"""The controller: the imperative shell around the pure policy (collect, decide, journal, act, reconcile)."""
