"""rankitect.blocks."""
