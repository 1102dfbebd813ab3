"""rankitect.eval."""
