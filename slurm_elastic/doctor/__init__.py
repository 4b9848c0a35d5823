"""``slurm-elastic doctor``: is this site's Slurm (and slurm-elastic's own setup) ready for elastic jobs?

:mod:`.model` holds the findings, :mod:`.slurm_checks` and :mod:`.site_checks` the pure checks (facts in,
findings out; unit-tested on replies recorded from live clusters), :mod:`.probes` the adapters that gather the
facts (Slurm commands, files, the state DB, MUNGE, the agents). docs/deployment.md, "Check the site".
"""
