"""dg's defs folder: one folder per component instance (``<name>/defs.yaml``)."""
