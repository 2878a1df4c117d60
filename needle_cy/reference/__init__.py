"""NumPy / pure-Python twins of the Cython modules: the executable specification.

Each module here mirrors one fast module (cq ↔ _cq, ops ↔ _ops, model ↔ model's
Cython path, bpe ↔ _bpe, grammar ↔ grammar._runtime) and is what tests diff against.
These modules import only leaf modules of the package (errors, cq_format, weights,
grammar.limits, grammar.numbers); the package imports them only at a backend switch or
where their encoder/decoder is the tool (tests/test_import_graph.py checks both).
"""
