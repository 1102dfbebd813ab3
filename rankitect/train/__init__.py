"""rankitect.train."""
