"""Real-framework fixtures: runs written by the frameworks' own save APIs (see generate.py)."""
