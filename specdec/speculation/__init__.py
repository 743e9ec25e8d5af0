"""Speculative decoding itself, pure of Triton: the draft-verify loop of a request (loop.py), the
proposers that need no model (prompt lookup in lookup.py, led by phrases.py and opening.py), how
long to draft (controller.py), rounds of requests in step (lockstep.py) and admission
(admission.py). Engines are reached through callables that the Triton layer provides."""
