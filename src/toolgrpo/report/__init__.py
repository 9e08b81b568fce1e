"""``toolgrpo report``: one self-contained HTML page of a run (config, curves, trajectories)."""
