"""`tuned-rl watch`: keep an applied profile in force for processes that start after it."""
