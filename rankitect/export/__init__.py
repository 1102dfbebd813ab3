"""rankitect.export."""
