"""The rule catalogue: metadata in ``catalogue.yaml``, predicates in ``checks.py``."""
