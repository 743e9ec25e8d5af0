"""Prompts for the exactness tests: chat, code, summaries and edits of a given passage, lists,
answers that run to max_tokens and answers that stop at the end-of-turn token."""

PASSAGE = (
    "The Amazon rainforest covers much of the Amazon basin of South America. This basin encompasses "
    "seven million square kilometers, of which five and a half million square kilometers are covered "
    "by the rainforest. The region includes territory belonging to nine nations."
)

PROMPTS = [
    ("What is the capital of France?", 48),
    ("Write a short poem about the sea.", 96),
    ("Write a Python function that returns the n-th Fibonacci number.", 96),
    (f"Summarize this passage in one sentence:\n\n{PASSAGE}", 64),
    (f"Repeat the following passage exactly:\n\n{PASSAGE}", 96),
    ("List five fruits, one per line.", 48),
    ("Explain what a hash table is to a beginner.", 96),
    (f"How many nations does the Amazon region include? Answer from the passage.\n\n{PASSAGE}", 32),
    ("Translate to French: The weather is nice today.", 32),
    ("Count from 1 to 20, separated by commas.", 80),
    ("Rewrite this code with better names:\n\ndef f(a, b):\n    c = a * b\n    return c + a", 80),
    ("Say hello.", 24),
]
