"""The stress scenarios of stress/run.py, one module per scenario (a to g, named
after what each does), plus what they share (common.py) and the bugs --sabotage
plants in the stock loop (sabotage.py).  run.py is the entry point: it runs each
scenario in a child process of its own and prints the table."""
