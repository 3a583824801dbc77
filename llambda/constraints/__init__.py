"""Constrained decoding: output that follows a JSON schema, a grammar or a regex, on llguidance.

`Grammars(tokenizer, vocab_size)` builds llguidance's view of a model's vocabulary once;
`Grammars.compile(spec)` turns a `GrammarSpec` into a `Grammar` (checked: a bad schema or
grammar is a `ConstraintError` naming the problem); `Grammar.start()` gives one sequence's
`Constraint`, whose `banned()` mask goes into the sampler and whose `advance(token)` follows
the chosen token.
"""
from .grammar import Constraint, ConstraintError, Grammar, Grammars, GrammarSpec, grammar_spec

__all__ = ["Constraint", "ConstraintError", "Grammar", "Grammars", "GrammarSpec", "grammar_spec"]
