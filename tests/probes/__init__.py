"""Hostile-input probes: what a careless user or a hostile peer does to a run, one test per act.

Each module groups one kind of hostility (a second process, foreign checkpoints, a run directory
edited by hand, a full disk, malformed data, a confusing command line). A new case is one more
test function, or one more row of the module's table of hostile inputs (``HOSTILE_*``): every
row must fail on the code before its fix and pass after.
"""
