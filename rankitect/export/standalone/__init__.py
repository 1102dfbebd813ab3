"""Standalone twins of the blocks: the source that exported ``model.py`` files are made of.

These modules import only ``math`` and ``torch`` (and each other), so
:mod:`rankitect.export.codegen` can copy the classes an architecture needs into one file that
runs without rankitect. Each class mirrors a class of :mod:`rankitect.blocks` or
:mod:`rankitect.space.builder`: the same constructor arguments (input shape, gene params,
``request_in``), the same submodule and buffer names (so state dicts load 1:1) and the same
forward math; input validation is left out, because an architecture is validated, and its
rankitect model built, before it is exported. ``tests/export`` proves every twin equal to its
original, masked and unmasked.
"""
