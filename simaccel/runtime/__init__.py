"""simaccel.runtime."""
