"""The benches: speed, search quality and faults, each run as ``python -m bench.<group>.<name>`` from the repository root."""
