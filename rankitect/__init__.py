"""rankitect: neural architecture search for ranking (click-through-rate) models."""

__version__ = "0.1.0"
