"""rankitect.search."""
