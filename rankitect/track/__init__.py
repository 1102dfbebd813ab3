"""rankitect.track."""
