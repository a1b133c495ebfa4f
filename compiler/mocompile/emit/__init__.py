"""Stage 5: turn a Plan into files (jinja2 templates; deterministic byte for byte)."""
