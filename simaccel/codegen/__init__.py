"""simaccel.codegen."""
