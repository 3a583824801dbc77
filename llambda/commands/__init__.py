"""Pieces of the `llambda` command line kept out of cli.py (its parser and the other commands):
one module per concern."""
