"""rankitect.data."""
