"""The folder ``streampool compare`` puts first on each run's PYTHONPATH (see sitecustomize.py)."""
