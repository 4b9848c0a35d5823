"""Job performance models: measured Pollux applications (:mod:`.pollux`), parametric (:mod:`.parametric`)."""
