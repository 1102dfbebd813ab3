"""rankitect.space."""
