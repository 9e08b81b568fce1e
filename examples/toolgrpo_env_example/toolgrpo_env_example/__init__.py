"""An example toolgrpo environment plugin (see docs/multi_turn.md, "Bring your own environment")."""
