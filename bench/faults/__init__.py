"""Faults a search must survive: kill -9, processes started together, bad inputs."""
